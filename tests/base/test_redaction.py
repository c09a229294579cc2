"""Credentials in a tracking URI: the whole user info and credential-named query values are masked in what the URI
shows, in any text holding a URI, and in the CLI's one error line for an unreachable server."""

from __future__ import annotations

import socket

import onnx
import pytest

from tests.commands import assert_one_line_error, run_cli
from tests.models import make_linear_model
from tracker.base.redaction import MASK, credential_query_values, protect_uri, redact, redact_uri


@pytest.mark.parametrize(("uri", "shown"), [
    ("http://alice:hunter2@127.0.0.1:5000/", f"http://{MASK}@127.0.0.1:5000/"),
    ("https://dapiTOKEN1234@host.example/", f"https://{MASK}@host.example/"),
    ("https://host/?token=abc123&x=1", f"https://host/?token={MASK}&x=1"),
    ("https://host/p?api_key=k1&Sig=s2&page=3&ACCESS_TOKEN=t", f"https://host/p?api_key={MASK}&Sig={MASK}&page=3"
                                                              f"&ACCESS_TOKEN={MASK}"),
    ("postgresql+psycopg2://u:pw@127.0.0.1:1/db", f"postgresql+psycopg2://{MASK}@127.0.0.1:1/db"),
])
def test_a_uri_shows_no_user_info_and_no_credential_query_value(uri, shown):
    assert redact_uri(uri) == shown


@pytest.mark.parametrize("uri", ["sqlite:///mlflow.db", "http://127.0.0.1:5000/", "https://host/?page=2&keyless",
                                 "file:///tmp/mlruns"])
def test_a_uri_without_credentials_is_shown_as_it_is(uri):
    assert redact_uri(uri) == uri


def test_credential_query_values_are_found_by_their_names():
    assert credential_query_values("https://h/?token=a&secret_x=b&page=1&password=c&sig=d") == ["a", "b", "c", "d"]
    assert credential_query_values("https://h/?page=1&sort=asc") == []


def test_a_token_alone_and_a_query_token_are_masked_in_any_later_text():
    protect_uri("https://dapiSECRETTOKEN42@host.example/?token=qsecret77&x=1")
    message = ("API request to https://dapiSECRETTOKEN42@host.example/api failed (token qsecret77); "
               "raw dapiSECRETTOKEN42")
    clean = redact(message)
    assert "dapiSECRETTOKEN42" not in clean and "qsecret77" not in clean
    assert f"https://{MASK}@host.example/api" in clean


def test_a_user_name_beside_a_password_is_masked_only_as_a_uris_user_info():
    protect_uri("postgresql://postgres:pgpass99@127.0.0.1:1/db")
    assert redact("postgresql://postgres:pgpass99@127.0.0.1:1/db said: role postgres, pgpass99") == (
        f"postgresql://{MASK}@127.0.0.1:1/db said: role postgres, {MASK}")
    assert redact("write to alice@example.org") == "write to alice@example.org"  # an address is not a URI


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("uri", ["http://dapiTOKEN5150@127.0.0.1:{port}/",
                                 "http://127.0.0.1:{port}/?token=qtoken5150",
                                 "http://bob:pw5150x@127.0.0.1:{port}/"])
def test_the_cli_error_for_an_unreachable_server_holds_no_credential(tmp_path, monkeypatch, capsys, uri):
    port = _free_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=port))
    monkeypatch.setenv("TRACKER_SERVER_TIMEOUT_S", "2")
    model = tmp_path / "linear.onnx"
    onnx.save_model(make_linear_model(n_features=4), str(model))
    code, out, err = run_cli(capsys, "profile", str(model), "--dim", "N=2")
    assert_one_line_error(code, err, "unreachable", f"127.0.0.1:{port}")
    for secret in ("dapiTOKEN5150", "qtoken5150", "pw5150x", "bob"):
        assert secret not in out + err
