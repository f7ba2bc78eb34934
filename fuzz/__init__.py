"""Coverage-guided fuzz harnesses (atheris) for the spec parsers and state machines (issue 17, item 7).

One module per target, ``fuzz/fuzz_<target>.py``, each runnable as ``python3 fuzz/fuzz_<target>.py
[libFuzzer options] [corpus dirs]``, and each exposing ``test_one_input(data: bytes) -> None`` (the
contract check, importable without atheris) and ``seeds() -> list[bytes]`` (the seed corpus, built
from the spec's vectors and the code's encoders).  ``python3 -m fuzz`` runs them (``fuzz/run.py``);
``docs/fuzzing.md`` describes the targets, their contracts and the long runs.
"""
