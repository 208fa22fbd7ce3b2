"""The plumbing under every concern: atomic file writes, the crash-safe swap journal, the one job runner,
who holds a workspace, the workspace folder itself, and backup/restore.
"""
