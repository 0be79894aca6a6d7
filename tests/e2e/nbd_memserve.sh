#!/usr/bin/env bash
# The NBD crate's own real-client scenario (crates/nbd/tests/real_clients.sh:
# nbdinfo, nbdsh, nbdcopy, qemu-img, qemu-io and fio against the `memserve`
# example, incl. the qemu:dirty-bitmap context), run as part of the suite.
. "$(dirname "$0")/lib.sh"
need nbdinfo nbdsh nbdcopy qemu-img qemu-io fio cmp
exec bash "$(dirname "$0")/../../crates/nbd/tests/real_clients.sh"
