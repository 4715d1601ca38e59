# -*- coding: utf-8 -*-
# Copyright (c) proxtalos.cluster contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""report.html from a report.json document. PRIVATE to the collection.

One self-contained page: inline CSS, inline SVG (a Gantt chart of stages and gates, the Flux
dependency graph by tiers), HTML tables. No script, no external asset, no web font, so it opens
from a CI artifact store or a mail attachment as it is. Every text from the report is escaped.
"""

from __future__ import annotations

from html import escape

from ansible_collections.proxtalos.cluster.plugins.plugin_utils._timeline import PART_MARK, offset_text, shown_parts

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px;color:#1d2433;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde6;padding-bottom:4px}
p.meta{color:#556;margin:0 0 12px}
table{border-collapse:collapse;font-size:13px;margin:4px 0 12px}
th,td{border:1px solid #d8dde6;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#176f2c;font-weight:600}.failed,.unreachable{color:#b42318;font-weight:600}
.changed{color:#8a5a00;font-weight:600}.skipped{color:#667}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.badge.ok{background:#1f8a3b}.badge.failed{background:#c0352b}
pre{background:#f6f8fa;padding:6px;margin:2px 0;white-space:pre-wrap;font-size:12px}
svg text{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif}
.empty{color:#667;font-style:italic}
"""

STATUS_COLOURS = {'ok': '#2f9e44', 'changed': '#e8a317', 'failed': '#d9480f', 'unreachable': '#d9480f',
                  'skipped': '#adb5bd'}
GATE_COLOURS = {True: '#37b24d', False: '#e03131'}
# Observations of a node that have a column of their own in the nodes table; the rest go to "observed".
NODE_COLUMNS = ('kubernetes_ready', 'kubernetes_reason', 'kubelet_version', 'talos_version', 'talos_stage',
                'talos_services', 'talos_services_unhealthy')


def _e(value):
    return escape('' if value is None else str(value), quote=True)


def _seconds(value):
    return '' if value is None else '%.1f s' % float(value)


def _table(headers, rows, empty='none'):
    if not rows:
        return '<p class="empty">%s</p>' % _e(empty)
    head = ''.join('<th>%s</th>' % _e(title) for title in headers)
    body = ''.join('<tr>%s</tr>' % ''.join(rows_cells) for rows_cells in rows)
    return '<table><thead><tr>%s</tr></thead><tbody>%s</tbody></table>' % (head, body)


def _cell(value, css=None):
    return '<td%s>%s</td>' % (' class="%s"' % css if css else '', _e(value))


def _status_cell(status):
    return '<td class="%s">%s</td>' % (_e(status), _e(status))


def _x_span(row, label_width, plot, total):
    """(x, width) in pixels of a row's start..end on the time axis."""
    start = float(row['start'])
    end = max(float(row['end']), start)
    return label_width + plot * start / total, max(2.0, plot * (end - start) / total)


def gantt_svg(report, width=980):
    """Stages as bars on the run's time axis, each followed by its parts and gates as thinner bars.

    A stage with several parts (site.yml plays apart from each other) is drawn as one bar per part on its own row, over
    a thin line of its whole span, so the gaps between its parts show; a row per part, named, follows it."""
    rows = []
    for stage in report['stages']:
        rows.append(('stage', stage))
        rows.extend(('part', part) for part in shown_parts(stage))
        for gate in report['gates']:
            if gate.get('stage') == stage['name']:
                rows.append(('gate', gate))
    loose = [gate for gate in report['gates'] if gate.get('stage') not in set(s['name'] for s in report['stages'])]
    rows.extend(('gate', gate) for gate in loose)
    if not rows:
        return '<p class="empty">no stage ran</p>'
    label_width = 300
    plot = width - label_width - 20
    row_height = 22
    top = 28
    total = max([report['duration']] + [row['end'] for kind, row in rows]) or 1.0
    height = top + row_height * len(rows) + 10
    drawn = ['<svg xmlns="http://www.w3.org/2000/svg" id="gantt" role="img" width="%d" height="%d" '
             'viewBox="0 0 %d %d" aria-label="Gantt chart of stages and gates">' % (width, height, width, height),
             '<title>Timeline of stages and gates</title>']
    for index in range(6):
        seconds = total * index / 5.0
        x = label_width + plot * index / 5.0
        drawn.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#e3e7ee"/>' % (x, top - 6, x, height - 6))
        drawn.append('<text x="%.1f" y="%d" font-size="11" fill="#556" text-anchor="middle">%s</text>'
                     % (x, top - 10, _e(offset_text(seconds) if total >= 5 else '+%.2fs' % seconds)))
    for number, (kind, row) in enumerate(rows):
        y = top + number * row_height
        x, width_px = _x_span(row, label_width, plot, total)
        if kind == 'stage' and shown_parts(row):
            label = row['name']
            drawn.append('<text x="4" y="%d" font-size="13" font-weight="600" fill="#1d2433">%s</text>'
                         % (y + 15, _e(label)))
            drawn.append('<rect class="stage-span" x="%.1f" y="%d" width="%.1f" height="2" fill="#adb5bd">'
                         '<title>%s: %s, %s to %s</title></rect>'
                         % (x, y + 9, width_px, _e(label), _e(row['status']), _e(offset_text(row['start'])),
                            _e(offset_text(row['end']))))
            for part in shown_parts(row):
                part_x, part_width = _x_span(part, label_width, plot, total)
                drawn.append('<rect class="stage-part-bar" x="%.1f" y="%d" width="%.1f" height="16" rx="3" fill="%s">'
                             '<title>%s: %s, %.1f s</title></rect>'
                             % (part_x, y + 2, part_width, STATUS_COLOURS.get(part['status'], '#868e96'),
                                _e(part['name']), _e(part['status']), part['duration']))
        elif kind == 'stage':
            colour = STATUS_COLOURS.get(row['status'], '#868e96')
            label = row['name']
            drawn.append('<text x="4" y="%d" font-size="13" font-weight="600" fill="#1d2433">%s</text>'
                         % (y + 15, _e(label)))
            drawn.append('<rect class="stage-bar" x="%.1f" y="%d" width="%.1f" height="16" rx="3" fill="%s">'
                         '<title>%s: %s, %.1f s</title></rect>'
                         % (x, y + 2, width_px, colour, _e(label), _e(row['status']), row['duration']))
        elif kind == 'part':
            drawn.append('<text x="12" y="%d" font-size="12" fill="#1d2433">%s</text>'
                         % (y + 14, _e(PART_MARK + row['name'])))
            drawn.append('<rect class="part-bar" x="%.1f" y="%d" width="%.1f" height="12" rx="2" fill="%s">'
                         '<title>%s: %s, %.1f s</title></rect>'
                         % (x, y + 4, width_px, STATUS_COLOURS.get(row['status'], '#868e96'), _e(row['name']),
                            _e(row['status']), row['duration']))
        else:
            colour = GATE_COLOURS[bool(row['ok'])]
            label = '%s (%s)' % (row['name'], row['host'])
            if len(label) > 44:
                label = label[:43] + '\u2026'
            drawn.append('<text x="18" y="%d" font-size="11" fill="#334">%s</text>' % (y + 14, _e(label)))
            drawn.append('<rect class="gate-bar" x="%.1f" y="%d" width="%.1f" height="10" rx="2" fill="%s">'
                         '<title>%s on %s: %s</title></rect>'
                         % (x, y + 5, width_px, colour, _e(row['name']), _e(row['host']),
                            _e('passed' if row['ok'] else 'FAILED: %s' % row.get('observation'))))
    drawn.append('</svg>')
    return ''.join(drawn)


def flux_svg(graph, width=980):
    """The Flux graph in tiers, left to right (tier 0 depends on nothing); edges dependency -> dependant."""
    if not graph or not graph.get('nodes'):
        return '<p class="empty">no Flux graph in this run (the flux_graph module did not run)</p>'
    columns = [list(tier) for tier in graph.get('tiers') or []]
    placed = set(node for tier in columns for node in tier)
    rest = [node['id'] for node in graph['nodes'] if node['id'] not in placed]
    if rest:
        columns.append(rest)
    box_width = 200
    box_height = 26
    gap_x = 60
    gap_y = 10
    positions = {}
    for col, ids in enumerate(columns):
        for row, node_id in enumerate(ids):
            positions[node_id] = (10 + col * (box_width + gap_x), 30 + row * (box_height + gap_y))
    svg_width = max(width, 20 + len(columns) * (box_width + gap_x))
    svg_height = 40 + max(len(ids) for ids in columns) * (box_height + gap_y)
    untiered = set(graph.get('untiered') or [])
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" id="flux-graph" role="img" width="%d" height="%d" '
             'viewBox="0 0 %d %d" aria-label="Flux dependency graph">' % (svg_width, svg_height, svg_width, svg_height),
             '<title>Flux dependency graph</title>',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#667"/></marker></defs>']
    for col in range(len(columns)):
        title = 'tier %d' % col if col < len(graph.get('tiers') or []) else 'in a cycle'
        parts.append('<text x="%d" y="16" font-size="12" fill="#556">%s</text>' % (10 + col * (box_width + gap_x), _e(title)))
    for source, target in graph.get('edges') or []:
        if source not in positions or target not in positions:
            continue
        (x1, y1), (x2, y2) = positions[source], positions[target]
        parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#8a94a6" marker-end="url(#arrow)"/>'
                     % (x1 + box_width, y1 + box_height // 2, x2, y2 + box_height // 2))
    for node in graph['nodes']:
        if node['id'] not in positions:
            continue
        x, y = positions[node['id']]
        fill = '#ffe3e3' if node['id'] in untiered else ('#e7f5ff' if node.get('kind') == 'Kustomization' else '#f3f0ff')
        name = node['id'].split('/', 1)[-1]
        label = name if len(name) <= 30 else name[:29] + '\u2026'
        parts.append('<rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="%s" stroke="#8a94a6"><title>%s</title></rect>'
                     % (x, y, box_width, box_height, fill, _e(node['id'])))
        parts.append('<text x="%d" y="%d" font-size="11" fill="#1d2433">%s</text>' % (x + 6, y + 17, _e(label)))
    parts.append('</svg>')
    return ''.join(parts)


def render(report):
    """The whole page for one report.json document."""
    cluster_facts = report['facts']['cluster']
    sections = []
    badge = 'ok' if report['status'] == 'ok' else 'failed'
    sections.append('<h1>proxtalos run report: %s <span class="badge %s">%s</span></h1>'
                    % (_e(report['cluster']), badge, _e(report['status'].upper())))
    sections.append('<p class="meta">%s &middot; started %s &middot; finished %s &middot; %.1f s%s</p>'
                    % (_e(report.get('playbook') or ''), _e(report['started']), _e(report['finished']),
                       report['duration'], ' &middot; check mode' if report['check_mode'] else ''))

    sections.append('<h2 id="timeline">Timeline</h2>')
    sections.append(gantt_svg(report))

    sections.append('<h2 id="bootstrap-timeline">Bootstrap timeline</h2>')
    stages = dict((stage['name'], stage) for stage in report['stages'])
    timeline_rows = []
    for row in report['bootstrap_timeline']:
        timeline_rows.append([_cell(row['stage']), _cell(row['start_offset'], 'num'), _status_cell(row['status'])])
        timeline_rows.extend([_cell(PART_MARK + part['name']), _cell(offset_text(part['start']), 'num'),
                              _status_cell(part['status'])] for part in shown_parts(stages.get(row['stage']) or {}))
    sections.append(_table(['stage', 'start offset', 'status'], timeline_rows, 'no stage ran'))
    sections.append(_table(['stage', 'start', 'end', 'duration', 'tasks', 'ok', 'changed', 'failed', 'skipped', 'hosts'],
                           [[_cell(row['name']), _cell(offset_text(row['start']), 'num'), _cell(offset_text(row['end']), 'num'),
                             _cell(_seconds(row['duration']), 'num'), _cell(row['tasks'], 'num'),
                             _cell(row['results'].get('ok', 0), 'num'), _cell(row['results'].get('changed', 0), 'num'),
                             _cell(row['results'].get('failed', 0) + row['results'].get('unreachable', 0), 'num'),
                             _cell(row['results'].get('skipped', 0), 'num'), _cell(len(row['hosts']), 'num')]
                            for row in report['stages']], 'no stage ran'))

    sections.append('<h2 id="gates">Gates</h2>')
    gate_rows = []
    for gate in report['gates']:
        diagnosis = ''.join('<pre>%s</pre>' % _e(line) for line in gate.get('diagnosis') or [])
        gate_rows.append([_cell(gate.get('stage') or ''), _cell(gate['name']), _cell(gate['host']),
                          '<td class="%s">%s</td>' % ('ok' if gate['ok'] else 'failed', 'passed' if gate['ok'] else 'FAILED'),
                          '<td>%s%s</td>' % (_e(gate.get('observation') or ''), diagnosis),
                          _cell(_seconds(gate.get('elapsed')), 'num'),
                          _cell('' if gate.get('attempts') is None else int(gate['attempts']), 'num'),
                          _cell(offset_text(gate['start']), 'num')])
    sections.append(_table(['stage', 'gate', 'host', 'result', 'observation', 'elapsed', 'attempts', 'started'],
                           gate_rows, 'no gate ran'))

    sections.append('<h2 id="remediation">Remediation log</h2>')
    sections.append(_table(['started', 'stage', 'action', 'target', 'reason', 'attempt', 'outcome'],
                           [[_cell(offset_text(step['start']), 'num'), _cell(step.get('stage') or ''), _cell(step['action']),
                             _cell(step['target']), _cell(step.get('reason') or ''),
                             _cell('' if step.get('attempt') is None else int(step['attempt']), 'num'),
                             _cell(step['outcome'])] for step in report['remediations']],
                           'no remediation was needed'))

    if report['failures']:
        sections.append('<h2 id="failures">Failures</h2>')
        sections.append(_table(['started', 'stage', 'host', 'task', 'message'],
                               [[_cell(offset_text(item['start']), 'num'), _cell(item.get('stage') or ''), _cell(item['host']),
                                 _cell(item['task']), '<td><pre>%s</pre></td>' % _e(item.get('message') or '')]
                                for item in report['failures']]))

    sections.append('<h2 id="flux">Flux dependency graph</h2>')
    graph = report.get('flux_graph')
    sections.append(flux_svg(graph))
    if graph and graph.get('findings'):
        sections.append(_table(['finding'], [[_cell(item)] for item in graph['findings']]))

    sections.append('<h2 id="facts">Cluster</h2>')
    sections.append(_table(['value', 'setting'], [[_cell(key), _cell(value)] for key, value in sorted(cluster_facts.items())],
                           'no cluster values known'))
    node_rows = []
    for node in report['facts']['nodes']:
        observed = node.get('observed') or {}
        ready = observed.get('kubernetes_ready')
        talos = ', '.join(str(observed[key]) for key in ('talos_version', 'talos_stage') if observed.get(key))
        unhealthy = observed.get('talos_services_unhealthy')
        services = observed.get('talos_services') or ''
        node_rows.append([_cell(node['name']), _cell(node.get('role') or ''), _cell(node.get('vm_id') or '', 'num'),
                          _cell(node.get('vm_pve_node') or ''), _cell(node.get('node_ip') or ''),
                          _cell('' if ready is None else ('Ready' if ready else 'NotReady: %s' % observed.get('kubernetes_reason', '')),
                                None if ready is None else ('ok' if ready else 'failed')),
                          _cell(observed.get('kubelet_version') or ''),
                          _cell(talos),
                          _cell(services + (' (not healthy: %s)' % unhealthy if unhealthy else ''),
                                None if not services else ('failed' if unhealthy else 'ok')),
                          _cell(', '.join('%s=%s' % (key, value) for key, value in sorted(observed.items())
                                          if key not in NODE_COLUMNS))])
    sections.append(_table(['node', 'role', 'vm_id', 'PVE node', 'address', 'Kubernetes', 'kubelet', 'Talos',
                            'Talos services', 'observed'], node_rows, 'no nodes known'))
    stats_rows = [[_cell(host)] + [_cell(counts.get(key, 0), 'num') for key in ('ok', 'changed', 'failures', 'unreachable', 'skipped')]
                  for host, counts in sorted(report['hosts'].items())]
    sections.append(_table(['host', 'ok', 'changed', 'failed', 'unreachable', 'skipped'], stats_rows, 'no host statistics'))

    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<title>proxtalos run report: %s</title><style>%s</style></head><body>%s</body></html>\n'
            % (_e(report['cluster']), CSS, '\n'.join(sections)))
