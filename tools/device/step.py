"""One call on the lent GPU machine: take in the model parts this call carried, start or check
background jobs, and put requested files in $OUT. Everything lives in /tmp/vb, which the machine
keeps while it is held (consecutive calls).

    python3 tools/device/step.py [--launch NAME -- CMD...] [--fetch FILE ...] [--wait TEXT SECONDS] [--tail N]

- parts: .device/parts/*.partNN are appended in order to /tmp/vb/models/NAME.incoming; after the
  last (the manifest in .device/meta/NAME.json) the sha256 is checked and the file renamed;
- wheels: .whl/*.whl (transformers 5.19: 5.17 cannot read GGUF tokenizers; gguf) are installed into
  /tmp/vb/site once;
- --launch: CMD runs in its own session (setsid) so that it outlives the call; its output goes to
  /tmp/vb/logs/NAME.log; the environment points the package at the repo copy and the models;
- every call prints the end of each job's log, whether it still runs, and the GPU's state.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VB = Path("/tmp/vb")
ENV = {
    "VOCABBRIDGE_MODELS": str(VB / "models"),
    "VOCABBRIDGE_CACHE": str(VB / "cache"),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def env(code: Path = ROOT) -> dict[str, str]:
    path = os.pathsep.join([str(VB / "site"), str(code), os.environ.get("PYTHONPATH", "")])
    return os.environ | ENV | {"PYTHONPATH": path}


def wheels() -> None:
    done = VB / "site" / ".installed"
    whl = sorted((ROOT / ".whl").glob("*.whl"))
    if done.exists() or not whl:
        return
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    subprocess.run([*cmd, "--upgrade", "--target", str(VB / "site"), *map(str, whl)], check=True)
    done.write_text("\n".join(w.name for w in whl))
    print("wheels installed:", ", ".join(w.name for w in whl))


def parts() -> None:
    models = VB / "models"
    for manifest in sorted((ROOT / ".device" / "meta").glob("*.json")):
        m = json.loads(manifest.read_text())
        name, total = m["name"], m["parts"]
        final, incoming, got = models / name, models / f"{name}.incoming", models / f"{name}.received"
        if final.exists():
            continue
        have = int(got.read_text()) if got.exists() else 0
        for p in sorted((ROOT / ".device" / "parts").glob(f"{name}.part*")):
            n = int(p.name.rsplit(".part", 1)[1])
            if n != have + 1:
                if n > have + 1:
                    print(f"{name}: part {n} out of order (have {have} of {total})")
                continue
            with incoming.open("ab") as out, p.open("rb") as src:
                shutil.copyfileobj(src, out)
            have = n
            got.write_text(str(have))
        print(f"{name}: {have} of {total} parts")
        if have == total:
            sha = hashlib.sha256()
            with incoming.open("rb") as f:
                while chunk := f.read(1 << 24):
                    sha.update(chunk)
            if sha.hexdigest() == m["sha256"]:
                incoming.rename(final)
                print(f"{name}: complete, sha256 ok")
            else:
                print(f"{name}: SHA256 MISMATCH ({sha.hexdigest()}), starting over")
                incoming.unlink()
                got.unlink()


def incomplete() -> list[str]:
    """The models whose manifest this call carried that have not all arrived on this machine."""
    names = [json.loads(m.read_text())["name"] for m in sorted((ROOT / ".device" / "meta").glob("*.json"))]
    return [n for n in names if not (VB / "models" / n).exists()]


def launch(name: str, cmd: list[str]) -> None:
    """CMD in its own session, from a frozen copy of the repo: the next calls re-send the working
    tree, and a job importing a module while that happens would find it missing. Refused while a
    model this call's manifests name is incomplete: a fresh machine (the last one went back between
    calls) has none of the parts sent before, and the job would spend minutes before failing."""
    if missing := incomplete():
        print(f"not launching {name}: {', '.join(missing)} incomplete on this machine (a fresh one?): send every part again")
        return
    code = VB / "code" / name
    shutil.rmtree(code, ignore_errors=True)
    shutil.copytree(ROOT, code, ignore=shutil.ignore_patterns(".git", ".device", ".whl", "__pycache__", "*.so"))
    log = VB / "logs" / f"{name}.log"
    with log.open("ab") as out:
        p = subprocess.Popen(cmd, cwd=code, env=env(code), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (VB / "logs" / f"{name}.pid").write_text(str(p.pid))
    print(f"launched {name} (pid {p.pid}): {' '.join(cmd)}")


def status(tail: int) -> None:
    for log in sorted((VB / "logs").glob("*.log")):
        pid_file = log.with_suffix(".pid")
        alive = pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists()
        lines = log.read_text(errors="replace").splitlines()
        print(f"---- {log.stem} ({'running' if alive else 'ended'}, {len(lines)} lines)")
        print("\n".join(line[-300:] for line in (lines[-tail:] if tail > 0 else [])))  # lines[-0:] is all of them
    r = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader"], capture_output=True, text=True
    )
    print("gpu:", r.stdout.strip() or r.stderr.strip())


def wait(text: str, seconds: float) -> None:
    """Hold the call (the machine goes back ~30 s after a call ends, and the jobs with it) until a
    job's log shows ``text``, every job has ended, or ``seconds`` have passed."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        logs = sorted((VB / "logs").glob("*.log"))
        if any(text in log.read_text(errors="replace") for log in logs):
            print(f"wait: '{text}' after {time.time() - t0:.0f} s")
            return
        pids = [p.read_text().strip() for p in (VB / "logs").glob("*.pid")]
        if pids and not any(Path(f"/proc/{pid}").exists() for pid in pids):
            print(f"wait: every job has ended, after {time.time() - t0:.0f} s")
            return
        time.sleep(5)
    print(f"wait: {seconds:.0f} s passed")


def fetch(files: list[str]) -> None:
    out = Path(os.environ.get("OUT", "/tmp/vb/out"))
    out.mkdir(parents=True, exist_ok=True)
    for f in files:
        for p in sorted(Path("/").glob(f.lstrip("/"))) if any(c in f for c in "*?[") else [Path(f)]:
            if p.is_file():
                shutil.copy(p, out / p.name)
                print(f"fetched {p} ({p.stat().st_size / 2**20:.1f} MiB)")
            else:
                print(f"fetch: no file {p}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", nargs=argparse.REMAINDER, help="NAME CMD...")
    ap.add_argument("--fetch", nargs="*", default=[])
    ap.add_argument("--tail", type=int, default=8)
    ap.add_argument("--run", help="a shell command to run now, in the prepared environment, before the status")
    ap.add_argument("--wait", nargs=2, metavar=("TEXT", "SECONDS"), help="wait until a job's log shows TEXT (or SECONDS pass)")
    args = ap.parse_args()
    for d in ("models", "logs", "site", "cache", "runs"):
        (VB / d).mkdir(parents=True, exist_ok=True)
    wheels()
    parts()
    if args.fetch:
        fetch(args.fetch)
    if args.run:
        subprocess.run(["bash", "-c", args.run], cwd=ROOT, env=env())
    if args.launch:
        launch(args.launch[0], args.launch[1:])
    if args.wait:
        wait(args.wait[0], float(args.wait[1]))
    status(args.tail)


if __name__ == "__main__":
    main()
