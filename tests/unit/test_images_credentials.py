"""DockerAuth → registry login (slurm_bt/images/credentials.py): the three upstream methods."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_bt.errors import SecretError
from slurm_bt.images.credentials import registry_login
from slurm_bt.job_spec import DockerAuthSpec
from slurm_bt.secrets_store import SecretStore


def _store(tmp: Path, **values: str) -> SecretStore:
    store = SecretStore(tmp / "secrets")
    for k, v in values.items():
        store.set(k, v)
    return store


def test_registry_secret_is_username_colon_password(tmp_path: Path) -> None:
    auth = DockerAuthSpec(auth_method="REGISTRY_SECRET", registry="ghcr.io", secrets=(("secret_ref", "tok"),))
    assert registry_login(auth, _store(tmp_path, tok="bob:p:w")) == ("bob", "p:w")
    with pytest.raises(SecretError) as err:
        registry_login(auth, _store(tmp_path / "2", tok="no-colon"))
    assert err.value.problems[0].loc == "job.image.docker_auth.registry_secret_docker_auth"
    assert "no-colon" not in str(err.value)


def test_gcp_service_account_is_the_json_key_user(tmp_path: Path) -> None:
    auth = DockerAuthSpec(auth_method="GCP_SERVICE_ACCOUNT_JSON", registry="us-docker.pkg.dev",
                          secrets=(("service_account_json_secret_ref", "sa"),))
    assert registry_login(auth, _store(tmp_path, sa='{"type": "service_account"}')) == (
        "_json_key", '{"type": "service_account"}')


def test_aws_iam_exchanges_the_keys_for_an_ecr_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moto = pytest.importorskip("moto")
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    auth = DockerAuthSpec(auth_method="AWS_IAM", registry="123456789012.dkr.ecr.eu-west-1.amazonaws.com",
                          secrets=(("access_key_secret_ref", "ak"), ("secret_access_key_secret_ref", "sk")))
    with moto.mock_aws():
        user, password = registry_login(auth, _store(tmp_path, ak="AKIAEXAMPLE", sk="secret"))
    assert user == "AWS" and password
