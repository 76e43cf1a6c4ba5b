"""The cleanup stack runs each action once, newest first, and survives failures."""

from harness.cleanup import CleanupStack


def test_run_all_is_lifo_and_once():
    stack = CleanupStack()
    calls = []
    stack.push("first", lambda: calls.append(1))
    stack.push("second", lambda: calls.append(2))
    stack.run_all()
    stack.run_all()
    assert calls == [2, 1]


def test_a_failing_action_does_not_stop_the_others(capsys):
    stack = CleanupStack()
    calls = []
    stack.push("fine", lambda: calls.append("fine"))
    stack.push("broken", lambda: 1 / 0)
    stack.run_all()
    assert calls == ["fine"]
    assert "cleanup 'broken' failed" in capsys.readouterr().err


def test_discard_and_run_one():
    stack = CleanupStack()
    calls = []
    kept = stack.push("kept", lambda: calls.append("kept"))
    dropped = stack.push("dropped", lambda: calls.append("dropped"))
    stack.discard(dropped)
    stack.run_one(kept)
    stack.run_one(kept)
    assert calls == ["kept"]
    assert stack.pending() == []


def test_scoped_runs_on_exception():
    stack = CleanupStack()
    calls = []
    try:
        with stack.scoped("undo", lambda: calls.append("undo")):
            raise ValueError("boom")
    except ValueError:
        pass
    assert calls == ["undo"]
