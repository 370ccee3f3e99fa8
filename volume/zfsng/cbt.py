"""Changed block tracking's answer to xapi (work in progress): the bitmap
of Volume.list_changed_blocks.

As xapi and Xen Orchestra read it (XenServer's CBT): one bit per
GRANULARITY bytes of the disk, the first block in the most significant bit
of the first byte (``01100000``: the second and third blocks changed),
base64 on the wire. xapi keeps only the bitmap, so the granularity is
fixed.
"""

import base64

GRANULARITY = 64 * 1024


def bitmap(ranges, size, granularity=GRANULARITY):
    """The bits of a disk of size bytes where each block touched by one of
    ranges ([(offset, end)], bytes, any order, may overlap) is set."""
    blocks = (size + granularity - 1) // granularity
    bits = bytearray((blocks + 7) // 8)
    for offset, end in ranges:
        first = offset // granularity
        last = min((end - 1) // granularity, blocks - 1)
        for block in range(first, last + 1):
            bits[block // 8] |= 0x80 >> (block % 8)
    return bytes(bits)


def encode(bits):
    return base64.b64encode(bits).decode("ascii")
