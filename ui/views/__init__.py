"""View models, one module per page: Store records in, tables, chart rows and labels out.

Pure functions (no Gradio, no Store): the tabs and the REST routers call them with what they read, and the tests
call them with hand-made records. ``text`` (table cells, version names, chat text shown as typed) is what every page
shares; ``arena`` is the Arena tab's leaderboard and reveal, ``dashboard`` the Dashboard's and Training tab's
version table, curves and volume bars. The leaderboard table itself is ``rlhf.analysis.arena.board``.
"""
