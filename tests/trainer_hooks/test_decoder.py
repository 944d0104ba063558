"""trainer_hooks/decoder.py: which decodes travel to the Monitor's worker (by value or by
reference), which cannot (and raise), and when a new object is the decode already sent."""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from trainer_hooks.decoder import dumps, same

ROOT = Path(__file__).resolve().parents[2]


def prefixed(prefix: str):  # type: ignore[no-untyped-def]
    def decode(token_ids: list[int]) -> list[str]:
        return [f"{prefix}{token}" for token in token_ids]

    return decode


class Vocab:
    def __init__(self, mark: str) -> None:
        self.mark = mark

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return [f"{self.mark}{token}" for token in token_ids]


def test_a_lambda_a_closure_and_a_bound_method_survive_the_trip() -> None:
    vocab = Vocab("▁")
    for decode, want in (
        (lambda ids: [f"L{token}" for token in ids], ["L1", "L2"]),
        (prefixed("C"), ["C1", "C2"]),
        (vocab.convert_ids_to_tokens, ["▁1", "▁2"]),
        (lambda ids: vocab.convert_ids_to_tokens(ids), ["▁1", "▁2"]),
    ):
        assert pickle.loads(dumps(decode))([1, 2]) == want


def test_a_function_of_a_plain_script_is_loaded_by_a_fresh_interpreter(tmp_path: Path) -> None:
    """What the worker is: another interpreter, which cannot import the script's __main__."""
    script = tmp_path / "train.py"
    blob = tmp_path / "decode.pickle"
    script.write_text(textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from trainer_hooks.decoder import dumps
        MARK = "<"
        def spelled(token_ids):
            return [f"{{MARK}}{{token}}>" for token in token_ids]
        open({str(blob)!r}, "wb").write(dumps(spelled))
        """
    ))  # fmt: skip
    subprocess.run([sys.executable, str(script)], cwd=tmp_path, check=True, timeout=60)
    loaded = subprocess.run(
        [sys.executable, "-c", f"import pickle; print(pickle.load(open({str(blob)!r}, 'rb'))([7, 8]))"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert loaded.stdout.strip() == "['<7>', '<8>']"


def test_a_decode_holding_a_socket_or_a_lock_cannot_travel_and_says_what() -> None:
    lock = threading.Lock()
    with socket.socket() as sock:
        for decode, what in (
            (lambda ids: [f"{sock.fileno()}{token}" for token in ids], "socket"),
            (lambda ids: [f"{lock}{token}" for token in ids], "lock"),
        ):
            with pytest.raises(TypeError, match=f"cannot pickle .*{what}"):
                dumps(decode)


def test_a_new_object_for_the_same_decode_is_the_same() -> None:
    vocab, other = Vocab("a"), Vocab("a")
    assert same(vocab.convert_ids_to_tokens, vocab.convert_ids_to_tokens)  # a fresh bound method each time
    assert not same(vocab.convert_ids_to_tokens, other.convert_ids_to_tokens)
    made = [lambda ids: [str(token) for token in ids] for _ in range(2)]  # written in the loop
    assert made[0] is not made[1] and same(made[0], made[1])
    assert not same(lambda ids: ids, lambda ids: ids)  # two lambdas, two codes
    assert same(prefixed("C"), prefixed("C"))
    assert not same(prefixed("C"), prefixed("D"))
    assert same([].append, [].append) is False and same(str.upper, str.upper)
    assert not same(prefixed("C"), None) and not same(None, prefixed("C"))
