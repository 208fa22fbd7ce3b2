"""``python -m core.train_triderm``'s closing next steps: the admin account only when the workspace has none."""
from __future__ import annotations

from annotations.accounts import accounts
from annotations.infra.workspace import Workspace
from core.train_triderm import next_steps

PASSWORD = "correct horse battery"


def test_the_admin_step_only_while_the_workspace_has_no_active_admin(tmp_path):
    ws = Workspace(tmp_path / "ws")
    first = next_steps(ws)
    assert "  1. create an admin account:" in first and "users add --role admin NAME" in first
    assert "  2. open the app:" in first and "  3. sign in;" in first
    accounts.add_account(ws.store, "Ann", "annotator", PASSWORD, "test")
    assert "create an admin account" in next_steps(ws)  # an annotator is no admin
    accounts.add_account(ws.store, "Ada", "admin", PASSWORD, "test")
    after = next_steps(ws)
    assert "create an admin account" not in after and "users add" not in after
    assert after.splitlines()[2:] == [line.replace("  2.", "  1.").replace("  3.", "  2.")
                                      for line in first.splitlines()[3:]]
