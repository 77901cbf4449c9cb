"""skopeo's failures are classified from its stderr: the class decides exit 2 (the user's input) or 1."""

from __future__ import annotations

import pytest

from slurm_bt.images.skopeo import classify


@pytest.mark.parametrize(("stderr", "kind"), [
    # a stopped registry on a port whose digits contain a status code is still unreachable
    ('time="..." level=fatal msg="pinging container registry 127.0.0.1:40123: Get '
     '\\"https://127.0.0.1:40123/v2/\\": dial tcp 127.0.0.1:40123: connect: connection refused"', "unreachable"),
    ('msg="Get \\"https://127.0.0.1:54044/v2/\\": dial tcp 127.0.0.1:54044: i/o timeout"', "unreachable"),
    ('msg="reading manifest 1.0 in 127.0.0.1:5444/team/app: unauthorized: authentication required"', "auth"),
    ('msg="reading manifest x: requested access to the resource is denied"', "auth"),
    ('msg="invalid status code from registry 403 (Forbidden)"', "auth"),
    ('msg="reading manifest nope in 127.0.0.1:5443/library/python: manifest unknown"', "not_found"),
    ('msg="invalid status code from registry 404 (Not Found)"', "not_found"),
    ('msg="writing blob: Digest did not match, expected sha256:aa401bb, got sha256:cc404dd"', "integrity"),
    # a local file skopeo could not write is not a registry's refusal of the credentials
    ('msg="creating directory /var/x: mkdir /var/x: permission denied"', "unreachable"),
])
def test_classify(stderr: str, kind: str) -> None:
    assert classify(stderr) == kind
