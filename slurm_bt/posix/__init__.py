"""posix"""
