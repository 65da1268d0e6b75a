"""The files the app ships beside its code, as package data (pyproject.toml's ``package-data``), so an installed
wheel carries them: read them through ``rlhf.assets.asset_path``, never by a path relative to a source file."""
