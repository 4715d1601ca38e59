"""_crypto: the cryptography dependency, PEM blocks, private keys parsed once per process, public key comparison."""
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.proxtalos.cluster.plugins.module_utils import _crypto
from ansible_collections.proxtalos.cluster.plugins.module_utils._errors import ProxtalosError


def _key_pem(key, private_format=serialization.PrivateFormat.TraditionalOpenSSL):
    return key.private_bytes(serialization.Encoding.PEM, private_format, serialization.NoEncryption())


def _self_signed(key):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'test')])
    start = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(start).not_valid_after(start + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))


def test_require_cryptography_says_how_to_install_it(monkeypatch):
    _crypto.require_cryptography()
    monkeypatch.setattr(_crypto, 'HAS_CRYPTOGRAPHY', False)
    monkeypatch.setattr(_crypto, 'CRYPTOGRAPHY_IMPORT_ERROR', ImportError('No module named cryptography'))
    with pytest.raises(ProxtalosError) as caught:
        _crypto.require_cryptography()
    assert str(caught.value) == ('the Python library "cryptography" is required (pip install cryptography): '
                                 'No module named cryptography')


def test_as_bytes_takes_text_or_bytes_only():
    assert _crypto.as_bytes(b'\x00pem') == b'\x00pem'
    assert _crypto.as_bytes('pem') == b'pem'
    with pytest.raises(TypeError, match='expected bytes or str, got NoneType'):
        _crypto.as_bytes(None)


def test_pem_blocks_gives_each_complete_block_in_order():
    text = ('leading text\n-----BEGIN CERTIFICATE-----\nQUFB\nQkJC\n-----END CERTIFICATE-----\n'
            '-----BEGIN EC PRIVATE KEY-----\r\nQ0ND\r\n-----END EC PRIVATE KEY-----\r\n')
    expected = [('CERTIFICATE', 'QUFB\nQkJC'), ('EC PRIVATE KEY', 'Q0ND')]
    assert _crypto.pem_blocks(text) == expected
    assert _crypto.pem_blocks(text.encode('ascii')) == expected
    assert _crypto.pem_label(text) == 'CERTIFICATE'


@pytest.mark.parametrize('text', [
    '',
    'no pem here',
    '-----BEGIN CERTIFICATE-----\nQUFB\n',  # no END line
    '-----BEGIN CERTIFICATE-----\nQUFB\n-----END PRIVATE KEY-----\n',  # the END line of another label
])
def test_text_without_a_complete_block_has_no_label(text):
    assert _crypto.pem_blocks(text) == []
    assert _crypto.pem_label(text) is None


def test_a_key_is_parsed_once_per_process(monkeypatch):
    """Parsing the 4096-bit RSA service account key costs about 0.25 s of CPU; a module run needs it several times."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = _key_pem(key)
    calls = []
    real = serialization.load_pem_private_key

    def counting(data, password=None, unsafe_skip_rsa_key_validation=False):
        calls.append(unsafe_skip_rsa_key_validation)
        return real(data, password=password, unsafe_skip_rsa_key_validation=unsafe_skip_rsa_key_validation)
    monkeypatch.setattr(_crypto.serialization, 'load_pem_private_key', counting)
    monkeypatch.setattr(_crypto, '_PARSED', {})
    first = _crypto.parse_private_key(pem)
    assert _crypto.parse_private_key(pem) is first
    # a key checked once serves a caller that would skip the check
    assert _crypto.parse_private_key(pem, check_consistency=False) is first
    assert calls == [False]
    # one parsed without the check does not serve a caller that wants it
    monkeypatch.setattr(_crypto, '_PARSED', {})
    unchecked = _crypto.parse_private_key(pem, check_consistency=False)
    assert _crypto.parse_private_key(pem, check_consistency=False) is unchecked
    assert _crypto.parse_private_key(pem) is not unchecked
    assert calls == [False, True, False]
    assert first.private_numbers() == key.private_numbers()


def test_a_pem_that_does_not_load_is_not_kept(monkeypatch):
    monkeypatch.setattr(_crypto, '_PARSED', {})
    broken = _key_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)).replace(b'MII', b'XXX')
    with pytest.raises(ValueError):
        _crypto.parse_private_key(broken)
    assert _crypto._PARSED == {}  # pylint: disable=protected-access


def test_public_key_der_tells_whether_a_certificate_and_a_key_belong_together():
    key = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    certificate = _self_signed(key)
    assert _crypto.public_key_der(certificate.public_key()) == _crypto.public_key_der(key.public_key())
    assert _crypto.public_key_der(certificate.public_key()) != _crypto.public_key_der(other.public_key())
    # the same key, PKCS#8 or SEC1 on the way in, has one public key
    reloaded = _crypto.parse_private_key(_key_pem(key, serialization.PrivateFormat.PKCS8))
    assert _crypto.public_key_der(reloaded.public_key()) == _crypto.public_key_der(key.public_key())
