"""TLS: --tls-ca-file / --tls-cert / --tls-key reach a secured scheduler (distributed's Security).

A throw-away CA and a certificate for 127.0.0.1 are made in the test (``cryptography``, else the
``openssl`` command). No GPU is needed: the CPU backend runs on a secured LocalCluster.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import shutil
import ssl
import subprocess

import numpy as np
import pytest
import zarr
from _pipeline_helpers import assert_nothing_complete

from batchlu import pipeline
from batchlu.testing.matrices import generate
from batchlu.pipeline.cluster import _connect
from batchlu.pipeline.cluster._gpu_cluster import make_security
from batchlu.pipeline.errors import BatchluError


def _with_cryptography(folder):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "batchlu test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "cert.pem").write_bytes(cert.public_bytes(pem))
    (folder / "key.pem").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))


def _with_openssl(folder):
    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=batchlu test CA",
        "-keyout", "ca-key.pem", "-out", "ca.pem")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "key.pem",
        "-out", "cert.csr")
    ssl("x509", "-req", "-in", "cert.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
        "-days", "1", "-out", "cert.pem")


def _make_certificates(folder) -> None:
    """A fresh CA, and a certificate for 127.0.0.1 signed by it, in ``folder``."""
    try:
        _with_cryptography(folder)
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("needs the cryptography package or the openssl command to make certificates")
        _with_openssl(folder)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    _make_certificates(folder)
    return {"tls.ca-file": str(folder / "ca.pem"), "tls.cert": str(folder / "cert.pem"),
            "tls.key": str(folder / "key.pem")}


@pytest.fixture(scope="module")
def matrices(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("in") / "a.zarr")
    a = generate("random", 6, "float64", seed=21, start=0, stop=90)
    arr = zarr.create_array(path, shape=a.shape, dtype=a.dtype, chunks=(16, 6, 6))
    arr[...] = a
    return path, a


@pytest.fixture(scope="module")
def secured_cluster(certs):
    from distributed import LocalCluster

    security = make_security(certs["tls.ca-file"], certs["tls.cert"], certs["tls.key"])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      protocol="tls", security=security, dashboard_address="127.0.0.1:0") as cluster:
        yield cluster


def test_run_on_a_secured_scheduler(secured_cluster, certs, matrices, tmp_path):
    path, a = matrices
    assert secured_cluster.scheduler_address.startswith("tls://")
    out = str(tmp_path / "inv.zarr")
    report = pipeline.run(path, out, op="inv", backend="cpu", scheduler=secured_cluster.scheduler_address,
                          progress=False, config=certs)
    assert report.status == "complete" and report.processed == a.shape[0]
    assert pipeline.verify(path, out).ok
    np.testing.assert_array_equal(zarr.open_array(out, path="info")[...], np.zeros(90, np.int32))


def test_scheduler_file_with_tls(secured_cluster, certs, matrices, tmp_path):
    import json

    path, a = matrices
    sched = tmp_path / "scheduler.json"
    sched.write_text(json.dumps({"address": secured_cluster.scheduler_address}))
    report = pipeline.run(path, str(tmp_path / "lu.zarr"), op="lu", backend="cpu",
                          scheduler_file=str(sched), progress=False, config=certs)
    assert report.processed == a.shape[0]


def _reasons(exc: BaseException, address: str) -> tuple[str, list[BaseException]]:
    """The messages of ``exc`` and of the exceptions it came from, with the scheduler's ``address``
    cut out (it holds "tls://", so a match on it would prove nothing), and those exceptions."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain).replace(address, "<scheduler>")
    return text, chain


def test_client_without_tls_settings_cannot_reach_a_secured_scheduler(secured_cluster, matrices, tmp_path):
    path, _ = matrices
    out = tmp_path / "refused.zarr"
    address = secured_cluster.scheduler_address
    with pytest.raises((TypeError, BatchluError)) as caught:
        pipeline.run(path, str(out), op="inv", backend="cpu", scheduler=address, progress=False,
                     config={"cluster.dashboard-address": "127.0.0.1:0"})
    reasons, _ = _reasons(caught.value, address)
    assert "tls://" not in reasons
    # distributed refuses a tls:// address without an SSL context: the client has no TLS settings
    assert re.search(r"ssl_context|SSLContext", reasons), reasons
    assert_nothing_complete(out)


def test_client_with_another_cas_certificate_is_refused(secured_cluster, matrices, tmp_path):
    path, _ = matrices
    folder = tmp_path / "other-ca"
    folder.mkdir()
    _make_certificates(folder)
    other = {"tls.ca-file": str(folder / "ca.pem"), "tls.cert": str(folder / "cert.pem"),
             "tls.key": str(folder / "key.pem")}
    out = tmp_path / "refused.zarr"
    address = secured_cluster.scheduler_address
    with pytest.raises((OSError, BatchluError)) as caught:
        pipeline.run(path, str(out), op="inv", backend="cpu", scheduler=address, progress=False,
                     config={**other, "cluster.dashboard-address": "127.0.0.1:0"})
    reasons, chain = _reasons(caught.value, address)
    # the TLS handshake itself failed, on the certificate
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain), reasons
    assert "CERTIFICATE_VERIFY_FAILED" in reasons, reasons
    assert_nothing_complete(out)


def test_embedded_cluster_listens_with_tls_on_loopback(certs):
    opts = pipeline.options({**certs, "cluster.n-workers": 1, "cluster.threads-per-worker": 1,
                             "cluster.dashboard-address": "127.0.0.1:0"}, backend="cpu")
    with _connect.connect(opts) as client:
        address = client.scheduler.address
        workers = list(client.scheduler_info()["workers"])
    assert address.startswith("tls://127.0.0.1:")
    assert workers and all(w.startswith("tls://127.0.0.1:") for w in workers)


def test_incomplete_tls_options_are_refused(certs, tmp_path):
    with pytest.raises(BatchluError, match="Expected --tls-ca-file and --tls-cert together"):
        make_security(certs["tls.ca-file"], None, None)
    with pytest.raises(BatchluError, match="readable PEM file"):
        make_security(str(tmp_path / "missing.pem"), certs["tls.cert"], certs["tls.key"])
    assert make_security(None, None, None) is None
