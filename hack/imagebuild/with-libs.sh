#!/usr/bin/env bash
# with-libs.sh PROGRAM...: print buildimage --file arguments that put each
# dynamically linked PROGRAM, the shared libraries it loads and its ELF
# interpreter into an image at the host's paths, one argument per line.
#
# The layercache image carries Debian's mkfs.btrfs this way: the node agent
# formats the btrfs image of the snapshot layout with it, and there is no
# static build of it to take instead.
set -euo pipefail
(($#)) || { echo "usage: with-libs.sh PROGRAM..." >&2; exit 2; }
for program in "$@"; do
	path=$(command -v "$program") || { echo "with-libs.sh: $program is not installed (for mkfs.btrfs: apt-get install btrfs-progs)" >&2; exit 1; }
	path=$(readlink -f "$path")
	echo "--file"
	echo "$path:$path"
	# ldd lines: "libx.so.1 => /lib/.../libx.so.1 (0x...)" and the
	# interpreter's "/lib64/ld-linux-x86-64.so.2 (0x...)".
	ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
		echo "--file"
		echo "$(readlink -f "$lib"):$lib"
	done
done
