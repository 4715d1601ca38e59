"""Go durations (metav1.Duration) as Flux specs carry them: '10m', '1h30m', '30s', '500ms'."""

import re

_PART = re.compile(r'(\d+(?:\.\d+)?)(ns|us|\u00b5s|ms|s|m|h)')
_UNITS = {'ns': 1e-9, 'us': 1e-6, '\u00b5s': 1e-6, 'ms': 1e-3, 's': 1.0, 'm': 60.0, 'h': 3600.0}


def parse(text, default=None):
    """Seconds in a Go duration string; default when text is empty; ValueError when it is not a duration."""
    if text in (None, ''):
        return default
    if isinstance(text, (int, float)):
        return float(text)
    value = str(text).strip()
    if value == '0':
        return 0.0
    position, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(value) or not value:
        raise ValueError('time: invalid duration "%s"' % value)
    return total


def format(seconds):  # pylint: disable=redefined-builtin
    """Go's Duration.String(): 300 -> '5m0s', 30 -> '30s', 3600 -> '1h0m0s', 1.5 -> '1.5s'."""
    if seconds == 0:
        return '0s'
    if seconds < 1:
        return '%gms' % round(seconds * 1000, 3)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    secs_text = ('%.9f' % secs).rstrip('0').rstrip('.') if secs != int(secs) else '%d' % secs
    if hours:
        return '%dh%dm%ss' % (hours, minutes, secs_text)
    if minutes:
        return '%dm%ss' % (minutes, secs_text)
    return '%ss' % secs_text
