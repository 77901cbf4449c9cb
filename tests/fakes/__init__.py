"""Test doubles shared by unit tests: inject them, never patch."""
