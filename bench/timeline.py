"""python -m bench.timeline ARTIFACTS_DIR: one measured bootstrap, stages and lab delays on one clock.

ARTIFACTS_DIR is the folder a benchmark's bootstrap wrote (report.json, bench-bootstrap.json,
ansible-playbook.log; its path is in the results' detail, `artifacts`). Prints, in report seconds:
every stage, every gate, and the first record of every lab delay (the steps of the critical path marked *),
then the per-stage breakdown (seconds the critical path was waiting inside the stage, and the rest).
For profiling: where the collection's own time goes between the world's waits.
"""

import json
import os
import sys

from bench.common import stage_breakdown


class _Step(object):
    def __init__(self, record):
        self.record = record


def lines(report, saved):
    shift = saved['shift']
    chain = {(s['kind'], s['target']) for s in saved['critical_path']['chain']}
    seen, events = set(), []
    for record in saved['delays']:
        key = (record['kind'], record['target'])
        if record.get('outcome') != 'done' or key in seen:
            continue
        seen.add(key)
        start = record['start'] + shift
        events.append((start, start + (record.get('duration') or 0.0), '%s%s' % ('*' if key in chain else ' ', record['kind']),
                       record['target']))
    for stage in report.get('stages', []):
        events.append((stage['start'], stage['end'], 'STAGE', stage['name']))
    for gate in report.get('gates', []):
        events.append((gate['start'], gate['end'], 'gate', '%s [%s]' % (gate['name'][:70], gate['host'])))
    out = ['%8s %8s  %-22s %s' % ('start', 'end', 'what', 'target')]
    out += ['%8.1f %8.1f  %-22s %s' % event for event in sorted(events)]
    steps = [_Step(s) for s in saved['delays'] if (s['kind'], s['target']) in chain and s.get('outcome') == 'done']
    first = {}
    for step in steps:
        first.setdefault((step.record['kind'], step.record['target']), step)
    out.append('')
    out.append('%-16s %6s %9s %9s %11s %9s' % ('stage', 'tasks', 'seconds', 'critical', 'collection', 'gap'))
    for row in stage_breakdown(report, list(first.values()), shift):
        out.append('%-16s %6s %9.1f %9.1f %11.1f %9.1f' % (row['stage'], row['tasks'], row['seconds'], row['critical_waiting'],
                                                           row['collection'], row['gap_before']))
    return out


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip())
        return 2
    folder = argv[0]
    with open(os.path.join(folder, 'report.json'), encoding='utf-8') as handle:
        report = json.load(handle)
    with open(os.path.join(folder, 'bench-bootstrap.json'), encoding='utf-8') as handle:
        saved = json.load(handle)
    print('\n'.join(lines(report, saved)))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
