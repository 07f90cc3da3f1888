"""Small leaves every part uses: atomic files and the JSON-lines reader (`files`), right padding
(`padding`), the HTTP discipline of every endpoint (`http_common`), stdout kept for results (`stdio`), a
quick exit (`process_exit`), how a command names itself in its usage (`prog`), a user's traceback as one
line (`tracebacks`), registry entries by config name, importing a user's module first (`registry`), and
the crash points of the kill-and-resume tests (`faults`)."""
