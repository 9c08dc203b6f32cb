"""A network of nodes: a directory that member nodes join, and search across their catalogs.

The same server serves a network in the ``network`` role (``dpnode serve --network``, its own
database). ``schemas`` holds what travels (strict, size-limited JSON); ``directory`` the
network's side (join tokens, members, catalogs, reachability, search); ``routes`` its API
under ``/api/v1/network``; ``membership`` a member node's side (join, leave, and the heartbeat
thread that keeps its catalog there); ``cli`` the ``dpnode network`` commands.
A network holds public catalogs only: no rows, no budgets, no member's accounts.
"""
