"""Sample texts for the behavioural diff: where two normalizers / pre-tokenizers part ways."""

from __future__ import annotations

import unicodedata

SAMPLES: dict[str, str] = {
    "korean": "안녕하세요. 오늘 날씨가 정말 좋네요! 내일 회의는 오후 3시에 시작합니다.",
    "korean_chat": "혹시 이 문제에 대해 도움이 필요하시다면 언제든지 문의해 주세요.",
    "english": "Hello world! It's a beautiful day, isn't it? I'll give them the results.",
    "shouting": "WE'LL SEE IF IT'S DONE BY FRIDAY.",
    "code": "def main(argv):\n    for i in range(10):\n        print(f'{i:03d}')  # pad\n    return 0\n",
    "digits": "Call 1234567890 or 3.14159; year 2026, 1,000,000 tokens.",
    "whitespace": "a  b   c\t\td\n\n\n   e    \n",
    "nfd_hangul": unicodedata.normalize("NFD", "한국어 텍스트 정규화 테스트"),
    "combining_latin": "cafe\u0301 nai\u0308ve re\u0301sume\u0301",
    "cjk": "東京は日本の首都です。中文文本测试。",
    "emoji": "Great job 👍🏽🎉 — see you at 10:30!",
    "fullwidth": "ＡＢＣ１２３ ｶﾀｶﾅ",
}
