"""docs/: the index links every page, and the relative links (and #anchors) of the pages resolve."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = os.path.join(ROOT, 'docs')
LINK = re.compile(r'\]\(([^)\s]+)\)')


def pages():
    found = []
    for directory, _dirs, names in os.walk(DOCS):
        found.extend(os.path.relpath(os.path.join(directory, name), DOCS) for name in names if name.endswith('.md'))
    return sorted(found)


def slug(heading):
    """GitHub's anchor for a heading: lowercase, punctuation but - and _ dropped, spaces to hyphens."""
    text = re.sub(r'[`*]', '', heading.strip().lower())
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    with open(path, encoding='utf-8') as stream:
        return set(slug(line.lstrip('#')) for line in stream if line.startswith('#'))


def test_index_links_every_page():
    with open(os.path.join(DOCS, 'README.md'), encoding='utf-8') as stream:
        index = stream.read()
    linked = set(os.path.normpath(target.split('#')[0]) for target in LINK.findall(index))
    # the GitOps skeleton is a repository template: its own README (linked from the index) links its folders' pages
    missing = [page for page in pages() if page != 'README.md' and page not in linked
               and not (page.startswith('gitops-skeleton' + os.sep) and page != os.path.join('gitops-skeleton', 'README.md'))]
    assert not missing, 'docs/README.md does not link: %s' % ', '.join(missing)


@pytest.mark.parametrize('page', pages())
def test_relative_links_resolve(page):
    path = os.path.join(DOCS, page)
    with open(path, encoding='utf-8') as stream:
        text = stream.read()
    text = re.sub(r'```.*?```', '', text, flags=re.S)   # code blocks are not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r'^[a-z]+:', target):
            continue   # http:, https:, mailto:
        file_part, _hash, anchor = target.partition('#')
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, '%s: broken links %s' % (page, broken)
