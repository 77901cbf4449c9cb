"""Loopback test servers for the weights sources: SeaweedFS (S3), fake-gcs-server, a fake HF Hub.

Everything binds to 127.0.0.1 on free ports, keeps its data in a temp dir and is stopped by
the PID (process group) we started. Nothing here ever talks to another host.
"""
