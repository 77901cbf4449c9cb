"""The site: the admin's files every side reads (site.toml) and the root-only hook policy (hooks.toml)."""
