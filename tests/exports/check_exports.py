#!/usr/bin/env python3
"""Checks the dynamic symbols libgraphalloc.so exports against tests/exports/expected_exports.txt.

  check_exports.py EXPECTED --library LIB [--nm NM]   reads LIB's exports with `NM -D --defined-only -C`
  check_exports.py EXPECTED --nm-output FILE          reads that output from FILE (the fixture)

Symbols are compared by entry, not one by one: a function overload or a compiler's second constructor is
no change of API, a new class or function is. An entry is a C symbol; a class, with every member and
nested class (graphalloc::CachingAllocator); a namespaced function or variable
(graphalloc::ComputeTotals); or a class's type_info or vtable ("typeinfo for graphalloc::Driver").
An expected entry written "? entry" may be absent: one whose symbols are all inline functions, which the
compiler emits out of line or not depending on the optimization level. Exits 1 naming each unexpected and
each missing entry.
"""
import argparse
import collections
import re
import subprocess
import sys

SPECIAL_PREFIXES = ('typeinfo for ', 'typeinfo name for ', 'vtable for ', 'VTT for ', 'construction vtable for ',
                    'guard variable for ', 'TLS init function for ', 'TLS wrapper function for ')


def split_top_level(text, separator):
    """Splits `text` at `separator` outside brackets of any kind."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in '(<[{':
            depth += 1
        elif c in ')>]}':
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i += len(separator)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts


def strip_return_type(name):
    """A function template's demangled name begins with its return type: keeps what follows it."""
    head = split_top_level(name, '(')[0] if '(' in name else name
    words = [w for w in split_top_level(head, ' ') if w]
    # "operator new", "operator bool": the operator's name holds a space of its own.
    while len(words) > 1 and words[-2].endswith('operator'):
        words[-2:] = [words[-2] + ' ' + words[-1]]
    if len(words) > 1 and not words[-1].startswith('const'):
        return name[name.index(words[-1], len(' '.join(words[:-1]))):]
    return name


def entry_of(symbol):
    """The entry a demangled symbol belongs to (see the module's docstring)."""
    for prefix in SPECIAL_PREFIXES:
        if symbol.startswith(prefix):
            return prefix + entry_of(symbol[len(prefix):])
    if '::' not in symbol and not symbol.startswith('graphalloc::'):
        return symbol.split('@')[0]  # a C symbol
    out = []
    # The project's namespaces are lower case, its classes and functions not: the entry ends at the first
    # component that is a class or function (a data member or variable in a namespace ends it too).
    for part in split_top_level(strip_return_type(symbol), '::'):
        operator = re.match(r'operator(\(\)|\[\]|[^(]+)', part)
        base = operator.group(0) if operator else re.split(r'[(<\[ ]', part, maxsplit=1)[0]
        out.append(base)
        if base[:1].isupper() or base.startswith(('operator', '~')):
            break
    return '::'.join(out)


def read_exports(lines):
    """{entry: [symbols]} from `nm -D --defined-only -C` output (address, type, name)."""
    entries = collections.defaultdict(list)
    for line in lines:
        fields = line.rstrip('\n').split(' ', 2)
        if len(fields) == 3 and len(fields[1]) == 1:
            name = fields[2]
        elif len(fields) == 2 and len(fields[0]) == 1:  # an address-less symbol
            name = fields[1]
        else:
            continue
        entries[entry_of(name)].append(name)
    return entries


def read_expected(path):
    required, optional = set(), set()
    with open(path, encoding='utf-8') as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line.startswith('?'):
                optional.add(line[1:].strip())
            elif line:
                required.add(line)
    return required, optional


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('expected')
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--library')
    source.add_argument('--nm-output')
    parser.add_argument('--nm', default='nm')
    args = parser.parse_args()

    if args.library:
        run = subprocess.run([args.nm, '-D', '--defined-only', '-C', args.library], capture_output=True,
                             text=True, check=False)
        if run.returncode != 0:
            print(f'exports: {args.nm} failed on {args.library}: {run.stderr.strip()}')
            return 1
        lines = run.stdout.splitlines()
    else:
        with open(args.nm_output, encoding='utf-8') as f:
            lines = f.readlines()
    exports = read_exports(lines)
    required, optional = read_expected(args.expected)

    unexpected = sorted(set(exports) - required - optional)
    missing = sorted(required - set(exports))
    for entry in unexpected:
        symbols = sorted(exports[entry])
        print(f'unexpected export: {entry} ({len(symbols)} symbol{"s" if len(symbols) > 1 else ""}, e.g. {symbols[0]}): hide it, or make it '
              'public in cmake/graphalloc.map and list it in tests/exports/expected_exports.txt')
    for entry in missing:
        print(f'missing export: {entry}: no longer exported; if that is meant, take it out of '
              'tests/exports/expected_exports.txt')
    count = sum(len(s) for s in exports.values())
    print(f'exports: {len(unexpected)} unexpected, {len(missing)} missing '
          f'({count} symbols in {len(exports)} entries)')
    return 1 if unexpected or missing else 0


if __name__ == '__main__':
    sys.exit(main())
