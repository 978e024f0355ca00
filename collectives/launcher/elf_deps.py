"""Reads the dynamic section of an ELF shared object: the libraries it needs and its run path.

The engine is linked by setup.py against the MPI whose ``mpicc`` it found, with an rpath to
that MPI's library directory. Reading it back from the binary is the one record of the build's
MPI that cannot go stale (a later ``pip install mpich`` or a different PATH does not change
it), and it needs neither ``readelf`` nor loading the library (which would start MPI).
"""
import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional

_SHT_DYNAMIC = 6
_DT_NULL, _DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 0, 1, 15, 29


@dataclass
class DynamicInfo:
    needed: List[str] = field(default_factory=list)  # DT_NEEDED sonames, in link order
    search_dirs: List[str] = field(default_factory=list)  # DT_RUNPATH (else DT_RPATH), $ORIGIN expanded


def read_dynamic(path) -> Optional[DynamicInfo]:
    """The NEEDED and RUNPATH/RPATH entries of ``path``; None if it is not a readable ELF file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or len(data) < 64:
        return None
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    try:
        return _parse(data, is64, order, os.path.dirname(os.path.abspath(path)))
    except (struct.error, IndexError, UnicodeDecodeError):
        return None


def _parse(data, is64, order, origin):
    if is64:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section = order + "IIQQQQIIQQ"  # name type flags addr offset size link info align entsize
        entry, entry_size = order + "qQ", 16
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section = order + "IIIIIIIIII"
        entry, entry_size = order + "iI", 8
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    info = DynamicInfo()
    for s in sections:
        if s[1] != _SHT_DYNAMIC:
            continue
        dyn_offset, dyn_size, strtab_index = s[4], s[5], s[6]
        strtab_offset = sections[strtab_index][4]
        runpath, rpath = None, None
        for pos in range(dyn_offset, dyn_offset + dyn_size, entry_size):
            tag, value = struct.unpack_from(entry, data, pos)
            if tag == _DT_NULL:
                break
            if tag in (_DT_NEEDED, _DT_RPATH, _DT_RUNPATH):
                end = data.index(b"\0", strtab_offset + value)
                text = data[strtab_offset + value:end].decode()
                if tag == _DT_NEEDED:
                    info.needed.append(text)
                elif tag == _DT_RUNPATH:
                    runpath = text
                else:
                    rpath = text
        # The dynamic loader ignores DT_RPATH when DT_RUNPATH is present.
        chosen = runpath if runpath is not None else rpath
        if chosen:
            info.search_dirs = [d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                                for d in chosen.split(":") if d]
        break
    return info
