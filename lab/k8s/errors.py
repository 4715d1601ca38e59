"""API errors as metav1.Status objects."""

_STATUS_REASON = {
    400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed', 406: 'NotAcceptable',
    409: 'Conflict', 410: 'Expired', 415: 'UnsupportedMediaType', 422: 'Invalid', 429: 'TooManyRequests', 500: 'InternalError',
    503: 'ServiceUnavailable', 504: 'Timeout',
}


class ApiError(Exception):
    """An error the API answers with: HTTP code, Status reason, message, optional details."""

    def __init__(self, code, reason=None, message='', details=None):
        super().__init__(message)
        self.code = code
        self.reason = reason or _STATUS_REASON.get(code, 'Unknown')
        self.message = message
        self.details = details

    def status(self):
        body = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'message': self.message,
                'reason': self.reason, 'code': self.code}
        if self.details:
            body['details'] = self.details
        return body


def qualified(rtype):
    """'deployments.apps' / 'pods': how the server names a resource in messages."""
    return '%s.%s' % (rtype.plural, rtype.group) if rtype.group else rtype.plural


def not_found(rtype, name):
    return ApiError(404, 'NotFound', '%s "%s" not found' % (qualified(rtype), name),
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def already_exists(rtype, name):
    return ApiError(409, 'AlreadyExists', '%s "%s" already exists' % (qualified(rtype), name),
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def conflict(rtype, name, message):
    return ApiError(409, 'Conflict', 'Operation cannot be fulfilled on %s "%s": %s' % (qualified(rtype), name, message),
                    {'name': name, 'group': rtype.group, 'kind': rtype.plural})


def invalid(rtype, name, problems):
    """422 Invalid with one cause per problem (reason, field, message), like field.ErrorList."""
    causes = [{'reason': p.reason, 'message': p.message, 'field': p.field} for p in problems]
    text = ', '.join('%s: %s' % (p.field, p.message) if p.field else p.message for p in problems)
    if len(problems) > 1:
        text = '[%s]' % text
    return ApiError(422, 'Invalid', '%s.%s "%s" is invalid: %s' % (rtype.kind, rtype.group or 'core', name, text) if rtype.group
                    else '%s "%s" is invalid: %s' % (rtype.kind, name, text),
                    {'name': name, 'group': rtype.group, 'kind': rtype.kind, 'causes': causes})
