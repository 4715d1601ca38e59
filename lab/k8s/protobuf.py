"""Decoding of the Kubernetes protobuf request bodies some clients send.

Typed client-go clientsets (helm's release storage, for instance) write Secrets and send
DeleteOptions as `application/vnd.kubernetes.protobuf`: the 4-byte magic `k8s\\0` and a
runtime.Unknown envelope (typeMeta = 1, raw = 2) around the object's own message. The lab
decodes the kinds such clients write (field numbers from k8s.io/api generated.proto) into the
same JSON form every other request uses; responses are always JSON, which these clients
accept.
"""

import base64
import datetime

from .errors import ApiError

MAGIC = b'k8s\x00'


def _varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError('truncated varint')
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data):
    """[(field number, value)]: varints as int, length-delimited as bytes, fixed as bytes."""
    out = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value = data[pos:pos + length]
            pos += length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError('unsupported wire type %d' % wire)
        out.append((number, value))
    return out


def _text(value):
    return value.decode('utf-8')


def _map(entries, value_bytes=False):
    out = {}
    for raw in entries:
        key, value = '', b''
        for number, item in fields(raw):
            if number == 1:
                key = _text(item)
            elif number == 2:
                value = item
        out[key] = base64.b64encode(value).decode() if value_bytes else _text(value)
    return out


def _time(raw):
    seconds = 0
    for number, item in fields(raw):
        if number == 1:
            seconds = item
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


_META_STRINGS = {1: 'name', 2: 'generateName', 3: 'namespace', 4: 'selfLink', 5: 'uid', 6: 'resourceVersion'}
_OWNER_FIELDS = {1: ('kind', _text), 3: ('name', _text), 4: ('uid', _text), 5: ('apiVersion', _text), 6: ('controller', bool),
                 7: ('blockOwnerDeletion', bool)}


def object_meta(raw):
    meta = {}
    labels, annotations, owners, finalizers = [], [], [], []
    for number, value in fields(raw):
        if number in _META_STRINGS:
            meta[_META_STRINGS[number]] = _text(value)
        elif number == 7:
            meta['generation'] = value
        elif number == 8:
            meta['creationTimestamp'] = _time(value)
        elif number == 11:
            labels.append(value)
        elif number == 12:
            annotations.append(value)
        elif number == 13:
            owner = {}
            for sub, item in fields(value):
                if sub in _OWNER_FIELDS:
                    name, convert = _OWNER_FIELDS[sub]
                    owner[name] = convert(item)
            owners.append(owner)
        elif number == 14:
            finalizers.append(_text(value))
    if labels:
        meta['labels'] = _map(labels)
    if annotations:
        meta['annotations'] = _map(annotations)
    if owners:
        meta['ownerReferences'] = owners
    if finalizers:
        meta['finalizers'] = finalizers
    return meta


def _secret(raw):
    obj = {}
    data, string_data = [], []
    for number, value in fields(raw):
        if number == 1:
            obj['metadata'] = object_meta(value)
        elif number == 2:
            data.append(value)
        elif number == 3:
            obj['type'] = _text(value)
        elif number == 4:
            string_data.append(value)
        elif number == 5:
            obj['immutable'] = bool(value)
    if data:
        obj['data'] = _map(data, value_bytes=True)
    if string_data:
        obj['stringData'] = _map(string_data)
    return obj


def _configmap(raw):
    obj = {}
    data, binary = [], []
    for number, value in fields(raw):
        if number == 1:
            obj['metadata'] = object_meta(value)
        elif number == 2:
            data.append(value)
        elif number == 3:
            binary.append(value)
        elif number == 4:
            obj['immutable'] = bool(value)
    if data:
        obj['data'] = _map(data)
    if binary:
        obj['binaryData'] = _map(binary, value_bytes=True)
    return obj


def _delete_options(raw):
    obj = {}
    for number, value in fields(raw):
        if number == 1:
            obj['gracePeriodSeconds'] = value
        elif number == 2:
            pre = {}
            for sub, item in fields(value):
                if sub == 1:
                    pre['uid'] = _text(item)
                elif sub == 2:
                    pre['resourceVersion'] = _text(item)
            obj['preconditions'] = pre
        elif number == 3:
            obj['orphanDependents'] = bool(value)
        elif number == 4:
            obj['propagationPolicy'] = _text(value)
        elif number == 5:
            obj.setdefault('dryRun', []).append(_text(value))
    return obj


DECODERS = {'Secret': _secret, 'ConfigMap': _configmap, 'DeleteOptions': _delete_options}


def decode(data):
    """A protobuf request body -> the JSON-form object; 415 for kinds the lab does not decode."""
    if not data.startswith(MAGIC):
        raise ApiError(400, 'BadRequest', 'the protobuf body does not start with the Kubernetes magic number')
    try:
        api_version = kind = ''
        raw = b''
        for number, value in fields(data[len(MAGIC):]):
            if number == 1:
                for sub, item in fields(value):
                    if sub == 1:
                        api_version = _text(item)
                    elif sub == 2:
                        kind = _text(item)
            elif number == 2:
                raw = value
        decoder = DECODERS.get(kind)
        if decoder is None:
            raise ApiError(415, 'UnsupportedMediaType', 'the lab API decodes protobuf only for %s; send %s as JSON'
                           % (', '.join(sorted(DECODERS)), kind or 'this object'))
        obj = decoder(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, 'BadRequest', 'could not decode the protobuf body: %s' % exc) from exc
    if kind != 'DeleteOptions':
        obj = dict({'apiVersion': api_version, 'kind': kind}, **obj)
    return obj
