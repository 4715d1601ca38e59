"""PVE's access control as the lab's PVE evaluates it: roles, ACLs with a propagate flag, users and tokens.

fakepve 0.5 grants a privilege on a path and everything below it, and adds a token's grants to its user's.
Real PVE differs in the ways the collection's documented role depends on, so the lab evaluates
permissions here instead; everything below imitates pve-access-control 9.1.1 (commit 5ccd07d):

- src/PVE/AccessControl.pm:1788-1891 `roles()`: the ACL tree is walked from `/` to the path; at each level
  an entry of the token (for a token) or of the user replaces what was found above; an entry applies to
  the level itself always and to the levels below only when its propagate flag is set (`$final ||
  $propagate`). Groups and pools are not modelled (the lab has none).
- src/PVE/AccessControl.pm:1804-1815 and src/PVE/RPCEnvironment.pm:136-176: a token without privilege
  separation has its user's privileges; a privilege-separated token has the roles of its own ACL entries,
  intersected with its user's privileges on the same path (RPCEnvironment.pm:98-106), the propagate flag
  of a privilege being set when both are.
- src/PVE/RPCEnvironment.pm:86-96: a privilege's propagate flag is set when any role that grants it on the
  path has its propagate flag set.
- src/PVE/RPCEnvironment.pm:241-289 `get_effective_permissions()` (GET /access/permissions): the default
  top-level paths and every ACL path, each with the privileges held there and their propagate flags;
  paths without privileges are left out. With `path`, only that path (src/PVE/API2/AccessControl.pm:561-565).
- root@pam holds every privilege (RPCEnvironment.pm:139-142).
"""

ROOT_USER = 'root@pam'
# RPCEnvironment.pm:245-254: the paths get_effective_permissions() always looks at.
DEFAULT_PATHS = ('/', '/access', '/access/groups', '/nodes', '/pool', '/sdn', '/storage', '/vms')


def _normal(path):
    """An ACL path as PVE keeps it: one leading slash, none at the end (src/PVE/AccessControl.pm:1263-1277 normalize_path)."""
    return '/' + path.strip('/') if path.strip('/') else '/'


def _split(path):
    """The levels of an ACL path: '' (the root) then each component (AccessControl.pm:1819-1822)."""
    path = '/' + path.strip('/') if path.strip('/') else '/'
    if path == '/':
        return ['']
    return path.split('/')


class AccessControl(object):
    """Roles, ACL entries (users and tokens) and tokens with their privsep flag, evaluated as PVE does."""

    def __init__(self, all_privileges):
        self.all_privileges = frozenset(all_privileges)
        self.roles = {}       # name -> frozenset of privileges
        self.entries = []     # (path, 'users' or 'tokens', id, role, propagate)
        self.tokens = {}      # 'user@realm!name' -> privsep (bool)

    def add_role(self, name, privileges):
        unknown = set(privileges) - self.all_privileges
        if unknown:
            raise ValueError('role %s: PVE has no privilege %s' % (name, ', '.join(sorted(unknown))))
        self.roles[name] = frozenset(privileges)

    def add_token(self, tokenid, privsep=True):
        self.tokens[tokenid] = bool(privsep)

    def grant(self, path, who, role, propagate=True):
        """`pveum acl modify PATH --users|--tokens WHO --roles ROLE [--propagate 0]`. An ACL node holds one
        propagate flag per (user or token, role): granting again sets the flag (src/PVE/API2/ACL.pm:244-256)."""
        if role not in self.roles:
            raise ValueError('no role %s' % role)
        self.revoke(path, who, role)
        kind = 'tokens' if '!' in who else 'users'
        self.entries.append((_normal(path), kind, who, role, bool(propagate)))

    def revoke(self, path, who, role):
        """`pveum acl delete PATH --users|--tokens WHO --roles ROLE` (src/PVE/API2/ACL.pm:242-253)."""
        path = _normal(path)
        self.entries = [entry for entry in self.entries if (entry[0], entry[2], entry[3]) != (path, who, role)]

    def acl_paths(self):
        return sorted(set(entry[0] for entry in self.entries))

    def _roles(self, who, path):
        """AccessControl.pm roles(): role -> propagate flag, for a user or a token's own entries."""
        kind = 'tokens' if '!' in who else 'users'
        levels = _split(path)
        found = {}
        walked = ''
        for index, level in enumerate(levels):
            walked = '/' if index == 0 else (walked.rstrip('/') + '/' + level)
            final = index == len(levels) - 1
            here = {}
            for entry_path, entry_kind, entry_who, role, propagate in self.entries:
                if entry_path == walked and entry_kind == kind and entry_who == who and (final or propagate):
                    here[role] = propagate
            if here:
                found = here   # a deeper entry replaces what was found above
        return found

    def _privileges_of_roles(self, roles):
        """RPCEnvironment.pm:86-96: privilege -> propagate flag (set when any granting role propagates)."""
        privs = {}
        for role, propagate in roles.items():
            for priv in self.roles.get(role, ()):
                privs[priv] = privs.get(priv, False) or propagate
        return privs

    def permissions(self, who, path):
        """RPCEnvironment.pm permissions(): privilege -> propagate flag that `who` holds on `path`."""
        if who.split('!', maxsplit=1)[0] == ROOT_USER:
            return dict.fromkeys(self.all_privileges, True)
        if '!' not in who:
            return self._privileges_of_roles(self._roles(who, path))
        if who not in self.tokens:
            return {}
        user = who.split('!', maxsplit=1)[0]
        user_privs = self.permissions(user, path)
        if not self.tokens[who]:
            return user_privs
        token_privs = self._privileges_of_roles(self._roles(who, path))
        return dict((p, user_privs[p] and flag) for p, flag in token_privs.items() if p in user_privs)

    def allowed(self, who, path, priv):
        return priv in self.permissions(who, path)

    def effective(self, who, path=None):
        """GET /access/permissions: {path: {privilege: 0|1}}."""
        if path:
            paths = [path]
        else:
            paths = sorted(set(DEFAULT_PATHS) | set(self.acl_paths()))
        out = {}
        for each in paths:
            privs = self.permissions(who, each)
            if privs or path:
                out[each] = dict((p, int(flag)) for p, flag in sorted(privs.items()))
        return out
