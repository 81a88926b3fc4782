"""The templates a local service offers: the host view (``base``) and image root filesystems.

A template is made from a directory holding a root filesystem (copied, so the
sandboxes' host uids can read it wherever it lies) or from an image archive
(``docker save`` / ``podman save`` output, an OCI layout in a tar, or a flat root
filesystem tar as ``docker export`` writes), unpacked once
into the service's cache (see
:mod:`piship_remote.local.isolation.oci_archive`). Every sandbox of a template
shares its root filesystem read-only; each one's writes stay its own::

    templates = prepare_templates({"alpine": "alpine.tar", "tools": "./rootfs"}, cache)
    templates["alpine"]      # the unpacked root filesystem
    templates["base"]        # None: the host's /usr, as without templates
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping

from piship_remote.local.isolation.oci_archive import (
    DEFAULT_IMAGE_LIMITS,
    ImageLimits,
    ImageRefused,
    copy_root,
    is_image_archive,
    unpack_image,
)
from piship_remote.local.isolation.trees import remove_tree, walk

__all__ = ["DEFAULT_TEMPLATE", "prepare_templates", "template_names"]

DEFAULT_TEMPLATE = "base"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def prepare_templates(
    sources: Mapping[str, str | os.PathLike[str]],
    cache: str,
    *,
    owner: int | None = None,
    image_limits: ImageLimits = DEFAULT_IMAGE_LIMITS,
) -> dict[str, str | None]:
    """Each template's root filesystem (``None``: the host view), archives unpacked into
    ``cache`` within ``image_limits``; ``ValueError`` naming the template that cannot be
    made (nothing of it is left in ``cache``).

    ``owner`` is the host uid (and gid) the files are given where the service maps its
    sandboxes' uids: one no sandbox maps, which each sandbox's mount of the template shows
    as its own root; nobody else may write them (group and other write bits are cleared).
    """
    templates: dict[str, str | None] = {DEFAULT_TEMPLATE: None}
    for name, source in sources.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"template name {name!r} must be letters, digits, '.', '_' or '-'")
        path = os.path.abspath(os.fspath(source))
        if not os.path.exists(path):
            raise ValueError(f"template {name}: {path} is not found")
        if not (os.path.isdir(path) or is_image_archive(path)):
            raise ValueError(
                f"template {name}: {path} is neither a directory (a root filesystem) nor a"
                " tar (docker save, podman save, an OCI layout, or docker export)"
            )
        os.makedirs(cache, 0o700, exist_ok=True)  # sandboxes reach templates only by mounts
        target = os.path.join(cache, name)
        try:
            if os.path.isdir(path):
                copy_root(path, target)
            else:
                unpack_image(path, target, image_limits)
            if owner is not None:
                _give_tree(target, owner)
        except (ImageRefused, OSError) as e:
            remove_tree(target)
            raise ValueError(f"template {name}: {path} cannot be unpacked: {e}") from None
        templates[name] = target
    return templates


def _give_tree(root: str, owner: int) -> None:
    _give(root, owner)
    for directory, dirnames, filenames in walk(root):
        for name in dirnames + filenames:
            _give(os.path.join(directory, name), owner)


def _give(path: str, owner: int) -> None:
    os.lchown(path, owner, owner)
    mode = os.lstat(path).st_mode
    if not stat.S_ISLNK(mode):
        os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_IWGRP | stat.S_IWOTH))


def template_names(templates: Mapping[str, str | None]) -> list[str]:
    """The names, the default first."""
    return [DEFAULT_TEMPLATE, *sorted(n for n in templates if n != DEFAULT_TEMPLATE)]
