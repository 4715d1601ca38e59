"""Every relative link of README.md and docs/ resolves to a file of the repository (and a #fragment to a heading
there), no document points outside the repository (a link or a path that leaves it, such as ../shared/), and the
docs index links every page."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = os.path.join(ROOT, 'docs')
LINK = re.compile(r'(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
FENCE = re.compile(r'^(```|~~~).*?^\1', re.S | re.M)
CODE = re.compile(r'`[^`\n]*`')
# a path that climbs out of the repository, in text or code (paths in prose are the repository root's)
OUTSIDE = re.compile(r'(?<![\w./-])(?:\.\./)+[A-Za-z0-9_.-]+')
# notes that are not part of the repository
NOTES = re.compile(r'facts: [\w.-]+\.md|research notes')


def documents():
    found = [os.path.join(ROOT, 'README.md')]
    for folder, dirs, names in os.walk(os.path.join(ROOT, 'docs')):
        dirs.sort()
        found.extend(os.path.join(folder, name) for name in sorted(names) if name.endswith('.md'))
    return found


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    counts = {}
    with open(path, encoding='utf-8') as handle:
        text = FENCE.sub('', handle.read())
    for line in text.splitlines():
        match = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if not match:
            continue
        slug = re.sub(r'[^\w\- ]', '', match.group(1).strip().lower().replace('`', '')).replace(' ', '-')
        number = counts.get(slug, 0)
        counts[slug] = number + 1
        out.add(slug if number == 0 else '%s-%d' % (slug, number))
    return out


def relative(path):
    return os.path.relpath(path, ROOT)


@pytest.mark.parametrize('path', documents(), ids=relative)
def test_every_relative_link_resolves_inside_the_repository(path):
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    broken = []
    for target in LINK.findall(FENCE.sub('', text)):
        if re.match(r'^[a-z][a-z0-9+.-]*:', target) or target.startswith('//'):
            continue    # an absolute URL (http:, https:, mailto:)
        file_part, dummy, fragment = target.partition('#')
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not resolved.startswith(ROOT + os.sep):
            broken.append('%s: leaves the repository' % target)
        elif not os.path.exists(resolved):
            broken.append('%s: no such file' % target)
        elif fragment and resolved.endswith('.md') and fragment not in anchors(resolved):
            broken.append('%s: no heading #%s in %s' % (target, fragment, relative(resolved)))
    assert broken == [], '%s: %s' % (relative(path), broken)


@pytest.mark.parametrize('path', documents(), ids=relative)
def test_no_document_points_outside_the_repository(path):
    with open(path, encoding='utf-8') as handle:
        text = handle.read()
    outside = NOTES.findall(text)
    for match in OUTSIDE.finditer(LINK.sub('', text)):
        resolved = os.path.normpath(os.path.join(ROOT, match.group(0)))
        if not resolved.startswith(ROOT + os.sep):
            outside.append(match.group(0))
    assert outside == [], '%s points outside the repository: %s' % (relative(path), outside)


def test_the_docs_index_links_every_page():
    with open(os.path.join(DOCS, 'README.md'), encoding='utf-8') as stream:
        index = FENCE.sub('', stream.read())
    linked = set(os.path.normpath(target.split('#')[0]) for target in LINK.findall(index))
    pages = [os.path.relpath(path, DOCS) for path in documents() if path.startswith(DOCS + os.sep)]
    # the GitOps skeleton is a repository template: its own README (linked from the index) links its folders' pages
    skeleton_readme = os.path.join('gitops-skeleton', 'README.md')
    missing = [page for page in pages if page != 'README.md' and page not in linked
               and not (page.startswith('gitops-skeleton' + os.sep) and page != skeleton_readme)]
    assert not missing, 'docs/README.md does not link: %s' % ', '.join(missing)
