#!/bin/bash
exec sh -c $'make -s guest-install && \\\n    python3 tests/bench/main.py --root /tmp/zfsng-root \\\n    --device /dev/disk/by-id/virtio-zfsng-d1 --out /results --quick'
