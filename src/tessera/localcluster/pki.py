"""Local PKI for the test control plane: a CA, serving and client certificates, SA keys.

Everything is generated with the ``cryptography`` package and written as PEM files into one
directory (mode 0600 for keys). Keys are ECDSA P-256 (certificates) and RSA-2048 (the
service-account token signing key, which every Kubernetes version accepts). Certificates
are valid for one year from creation; ``tessera cluster up`` makes a fresh set each time.

Files written by :func:`make_pki` (``<name>.crt`` + ``<name>.key`` unless noted):

====================  ==================================================================
``ca``                self-signed CA that signs everything below; API clients trust it
``etcd-server``       etcd serving certificate (SAN 127.0.0.1, localhost)
``etcd-client``       kube-apiserver's client certificate towards etcd
``apiserver``         kube-apiserver serving certificate (127.0.0.1, 10.96.0.1, kubernetes.*,
                      plus ``apiserver_ips``: the real node's bridge address)
``admin``             CN=tessera-admin, O=system:masters (the kubeconfig user)
``apiserver-kubelet-client``  CN=kube-apiserver-kubelet-client, O=system:masters: the API
                      server's client certificate towards kubelets (exec, logs, proxy)
``kube-scheduler``    CN=system:kube-scheduler (client)
``kube-controller-manager``  CN=system:kube-controller-manager (client)
``scheduler-serving`` / ``controller-manager-serving``  their secure-port certificates
``front-proxy-ca``    separate CA for the API server's request-header (aggregation) clients
``front-proxy-client``  CN=front-proxy-client, signed by ``front-proxy-ca``
``sa.key`` / ``sa.pub``  service-account signing key pair (RSA, PKCS#8 / SubjectPublicKeyInfo)
====================  ==================================================================

:func:`issue_node_certs` adds, for a real node, ``kubelet-client`` (CN=system:node:<name>,
O=system:nodes: what the Node authorizer and the NodeRestriction rules expect),
``kubelet-serving`` (the kubelet's port 10250; SANs: the node name and its addresses) and
``kube-proxy-client`` (CN=system:kube-proxy: the bootstrap binding ``system:node-proxier``
names that user), signed by the same CA.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: First address of the service CIDR the API server is started with (``10.96.0.0/16``);
#: the ``kubernetes`` Service gets it, so the serving certificate names it.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"

_VALIDITY = _dt.timedelta(days=365)


@dataclass(frozen=True)
class CertPair:
    """Paths of one PEM certificate and its private key."""

    cert: Path
    key: Path


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


class _CA:
    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def load(cls, cert: Path, key: Path) -> _CA:
        """The CA written earlier by :func:`make_pki` (PEM certificate and PKCS#8 key)."""
        ca_key = serialization.load_pem_private_key(key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key}: not an ECDSA private key (was it written by make_pki?)")
        return cls(x509.load_pem_x509_certificate(cert.read_bytes()), ca_key)

    @classmethod
    def create(cls, cn: str) -> _CA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _dt.datetime.now(_dt.UTC)
        name = _name(cn)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    def issue(
        self,
        cn: str,
        *,
        orgs: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _dt.datetime.now(_dt.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
        )
        if dns or ips:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key


@dataclass(frozen=True)
class Pki:
    """Paths of everything :func:`make_pki` wrote. ``sa_key``/``sa_pub`` are PEM files."""

    dir: Path
    ca: CertPair
    etcd_server: CertPair
    etcd_client: CertPair
    apiserver: CertPair
    admin: CertPair
    apiserver_kubelet_client: CertPair
    scheduler: CertPair
    controller_manager: CertPair
    scheduler_serving: CertPair
    controller_manager_serving: CertPair
    front_proxy_ca: CertPair
    front_proxy_client: CertPair
    sa_key: Path
    sa_pub: Path


#: Common name of the request-header client certificate (``--requestheader-allowed-names``).
FRONT_PROXY_CLIENT = "front-proxy-client"
#: Common name of the API server's client certificate towards kubelets (as kubeadm names it).
APISERVER_KUBELET_CLIENT = "kube-apiserver-kubelet-client"


def make_pki(directory: Path, apiserver_ips: tuple[str, ...] = ()) -> Pki:
    """Create a fresh CA and all certificates and keys the control plane needs.

    ``directory`` is created if missing; existing files of the same names are overwritten.
    ``apiserver_ips`` are further IP SANs of the API server's certificate (the address it
    advertises). Returns a :class:`Pki` with the file paths. Raises ``OSError`` if the
    directory is not writable.
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = _CA.create("tessera-cluster-ca")

    def save(name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPair:
        pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write(pair.key, _key_pem(key), private=True)
        return pair

    loopback = ("127.0.0.1",)
    local_dns = ("localhost",)
    ca_pair = save("ca", ca.cert, ca.key)
    etcd_server = save(
        "etcd-server", *ca.issue("etcd", server=True, client=True, dns=local_dns, ips=loopback)
    )
    etcd_client = save("etcd-client", *ca.issue("kube-apiserver-etcd-client", client=True))
    apiserver = save(
        "apiserver",
        *ca.issue(
            "kube-apiserver",
            server=True,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=tuple(dict.fromkeys((*loopback, KUBERNETES_SERVICE_IP, *apiserver_ips))),
        ),
    )
    admin = save("admin", *ca.issue("tessera-admin", orgs=("system:masters",), client=True))
    apiserver_kubelet_client = save(
        "apiserver-kubelet-client",
        *ca.issue(APISERVER_KUBELET_CLIENT, orgs=("system:masters",), client=True),
    )
    scheduler = save("kube-scheduler", *ca.issue("system:kube-scheduler", client=True))
    kcm = save("kube-controller-manager", *ca.issue("system:kube-controller-manager", client=True))
    sched_serving = save(
        "scheduler-serving", *ca.issue("kube-scheduler", server=True, dns=local_dns, ips=loopback)
    )
    kcm_serving = save(
        "controller-manager-serving",
        *ca.issue("kube-controller-manager", server=True, dns=local_dns, ips=loopback),
    )
    fp_ca = _CA.create("tessera-front-proxy-ca")
    fp_ca_pair = save("front-proxy-ca", fp_ca.cert, fp_ca.key)
    fp_client = save("front-proxy-client", *fp_ca.issue(FRONT_PROXY_CLIENT, client=True))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key = directory / "sa.key"
    sa_pub = directory / "sa.pub"
    _write(sa_key, _key_pem(sa), private=True)
    _write(
        sa_pub,
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        private=False,
    )
    return Pki(
        dir=directory,
        ca=ca_pair,
        etcd_server=etcd_server,
        etcd_client=etcd_client,
        apiserver=apiserver,
        admin=admin,
        apiserver_kubelet_client=apiserver_kubelet_client,
        scheduler=scheduler,
        controller_manager=kcm,
        scheduler_serving=sched_serving,
        controller_manager_serving=kcm_serving,
        front_proxy_ca=fp_ca_pair,
        front_proxy_client=fp_client,
        sa_key=sa_key,
        sa_pub=sa_pub,
    )


def make_serving_certificate(
    directory: Path,
    name: str,
    *,
    dns: tuple[str, ...] = ("localhost",),
    ips: tuple[str, ...] = ("127.0.0.1",),
    ca: CertPair | None = None,
) -> tuple[CertPair, CertPair]:
    """A serving certificate ``<name>.crt``/``<name>.key`` for ``dns``/``ips`` in ``directory``,
    signed by ``ca`` (a pair written by this module) or by a new CA ``<name>-ca``. Returns
    ``(ca, serving)``: what a webhook serves and the ``caBundle`` the API server trusts it with.
    A second call with the same ``ca`` issues a new serving pair (certificate rotation)."""
    if ca is None:
        new_ca = _CA.create(f"{name}-ca")
        ca = CertPair(directory / f"{name}-ca.crt", directory / f"{name}-ca.key")
        _write(ca.cert, new_ca.cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write(ca.key, _key_pem(new_ca.key), private=True)
        signer = new_ca
    else:
        signer = _CA.load(ca.cert, ca.key)
    cert, key = signer.issue(dns[0] if dns else name, server=True, dns=dns, ips=ips)
    serving = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    _write(serving.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(serving.key, _key_pem(key), private=True)
    return ca, serving


@dataclass(frozen=True)
class NodeCerts:
    """A real node's certificates: ``client`` (kubelet -> API server), ``serving`` (port
    10250) and ``proxy`` (kube-proxy -> API server)."""

    client: CertPair
    serving: CertPair
    proxy: CertPair


#: kube-proxy's user: the bootstrap ClusterRoleBinding ``system:node-proxier`` grants it.
KUBE_PROXY_USER = "system:kube-proxy"


def issue_node_certs(directory: Path, node_name: str, addresses: tuple[str, ...]) -> NodeCerts:
    """Issue the node's certificates for ``node_name`` with the CA :func:`make_pki` wrote
    into ``directory``: ``kubelet-client`` (CN=system:node:<node_name>, O=system:nodes),
    ``kubelet-serving`` (DNS SAN ``node_name``, IP SANs ``addresses``) and
    ``kube-proxy-client`` (CN=system:kube-proxy). Raises ``OSError`` when the CA files are
    missing, ``ValueError`` when they are not make_pki's.
    """
    ca = _CA.load(directory / "ca.crt", directory / "ca.key")
    out = []
    for name, (cert, key) in (
        (
            "kubelet-client",
            ca.issue(f"system:node:{node_name}", orgs=("system:nodes",), client=True),
        ),
        ("kubelet-serving", ca.issue(node_name, server=True, dns=(node_name,), ips=addresses)),
        ("kube-proxy-client", ca.issue(KUBE_PROXY_USER, client=True)),
    ):
        pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write(pair.key, _key_pem(key), private=True)
        out.append(pair)
    return NodeCerts(client=out[0], serving=out[1], proxy=out[2])
