"""An RSA key that parses but whose numbers are wrong: what the keepers' full consistency check is for."""
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def flipped_exponent_pem(private_key, private_format=serialization.PrivateFormat.PKCS8):
    """PEM of private_key with one bit of its private exponent flipped. n and e (the public key) are intact, so it
    still matches its certificate and loads when its numbers are not checked; OpenSSL's check refuses it."""
    numbers = private_key.private_numbers()
    broken = rsa.RSAPrivateNumbers(numbers.p, numbers.q, numbers.d ^ (1 << 5), numbers.dmp1, numbers.dmq1, numbers.iqmp,
                                   numbers.public_numbers).private_key(unsafe_skip_rsa_key_validation=True)
    return broken.private_bytes(serialization.Encoding.PEM, private_format, serialization.NoEncryption())
