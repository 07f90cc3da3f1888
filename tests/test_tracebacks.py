"""Which frame a user's failure is reported at: the innermost one in the user's own file, never one of
agentrl's (any of its folders), the standard library's or an installed package's."""

from __future__ import annotations

import json

from agentrl.config import load_config
from agentrl.utils.tracebacks import describe, user_frame


def _users_code(tmp_path):
    user = tmp_path / "my_env.py"
    user.write_text("def reset(load):\n    return load(None, ['not.a.key=1'])\n")
    scope: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), scope)
    return user, scope["reset"]


def test_the_frame_named_is_the_users_not_agentrls_or_the_librarys(tmp_path):
    user, reset = _users_code(tmp_path)
    try:
        reset(load_config)  # raises deep inside agentrl/config/: the user's line is what is named
    except Exception as exc:  # noqa: BLE001 - the exception under test
        frame = user_frame(exc)
        line, _ = describe(exc)
    assert (frame.filename, frame.lineno) == (str(user), 2)
    assert line.endswith(f"(at {user}:2 in reset)")
    try:
        reset(json.loads)  # raises inside the standard library: skipped as well
    except Exception as exc:  # noqa: BLE001
        assert user_frame(exc).filename == str(user)
