"""X.509 for the lab's own servers: a CA, certificates it issues (serving or client), and for the Kubernetes API a
serving certificate (from the cluster CA) and an admin client certificate like the ones Talos puts in a kubeconfig.

Used by both Kubernetes worlds (lab/k8s, lab/k8s_upstream's control plane), the upstream Flux world's Git server and the
artifact mirror. The certificates a simulated Talos node makes for itself are lab/talos/pki.py."""

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, ed448
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_DNS = ('kubernetes', 'kubernetes.default', 'kubernetes.default.svc', 'kubernetes.default.svc.cluster.local', 'localhost')


def load_private_key(pem):
    """A PEM private key; Talos labels PKCS#8 Ed25519 keys 'ED25519 PRIVATE KEY'."""
    data = pem.encode() if isinstance(pem, str) else pem
    data = data.replace(b'ED25519 PRIVATE KEY', b'PRIVATE KEY')
    return serialization.load_pem_private_key(data, password=None)


def _sign_hash(key):
    return None if isinstance(key, (ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)) else hashes.SHA256()


def _pem_key(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def _pem_cert(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _builder(subject, issuer, public_key, days):
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def make_ca(common_name='kubernetes', days=3650):
    """(cert_pem, key_pem) of a new ECDSA P-256 CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, 'kubernetes'), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (_builder(name, name, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, _sign_hash(key)))
    return _pem_cert(cert), _pem_key(key)


def issue(ca_cert_pem, ca_key_pem, common_name, organizations=(), dns_names=(), ip_addresses=(), server=False, days=365):
    """(cert_pem, key_pem): an ECDSA P-256 leaf signed by the CA (client auth, or server auth)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode() if isinstance(ca_cert_pem, str) else ca_cert_pem)
    ca_key = load_private_key(ca_key_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (_builder(x509.Name(attrs), ca_cert.subject, key.public_key(), days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=True,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                              critical=False))
    sans = [x509.DNSName(name) for name in dns_names] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, _sign_hash(ca_key))
    return _pem_cert(cert), _pem_key(key)


def serving_cert(ca_cert_pem, ca_key_pem, hosts, service_ip='10.96.0.1'):
    """The API server's certificate: every endpoint IP, 127.0.0.1, the service IP and names."""
    ips = list(dict.fromkeys(list(hosts) + ['127.0.0.1', service_ip]))
    return issue(ca_cert_pem, ca_key_pem, 'kube-apiserver', (), SERVICE_DNS, ips, server=True)


def admin_cert(ca_cert_pem, ca_key_pem, common_name='admin', organizations=('system:masters',)):
    return issue(ca_cert_pem, ca_key_pem, common_name, organizations)
