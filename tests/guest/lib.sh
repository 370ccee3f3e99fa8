# Shared by the guest image builders (build-image.sh, blktap-image.sh):
# sourced, never run. Each builder defines log and die first.

# An image directory is complete once all four of its files are there (a
# builder renames its work area into place only when done).
image_complete() {
    [ -s "$1/rootfs.img" ] && [ -s "$1/vmlinuz" ] && [ -s "$1/initrd.img" ] && [ -s "$1/info" ]
}

# One builder per image: take the image's lock on fd 9 (held until the
# builder exits), waiting for another builder of it. Prints the image and
# exits when that one completed it meanwhile.
one_builder() {   # lock-file image-dir
    exec 9>"$1"
    if ! flock -n 9; then
        log "another build of $2 is running; waiting for it"
        flock 9
    fi
    if image_complete "$2"; then
        echo "$2"
        exit 0
    fi
}

# The work area: $work (made by the caller beside the cache, so that the
# final rename is atomic) with the chroot at $root. Everything mounted with
# mnt is unmounted on any exit, and the area removed, but never through a
# mount still alive (proc, sys, dev/pts).
mounted=()
unmount_all() {
    local i
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
        umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
    done
    mounted=()
}
cleanup_work() {
    unmount_all
    if grep -q " $work/" /proc/mounts; then
        log "leaving $work: something is still mounted under it"
    else
        rm -rf "$work"
    fi
}
work_area() {   # work-dir
    work=$1
    root=$work/root
    trap cleanup_work EXIT
    trap 'exit 130' INT TERM
}
mnt() { mount "$@"; mounted+=("${*: -1}"); }
in_root() {
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}
