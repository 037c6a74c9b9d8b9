#!/bin/bash
# tests/vm/run-in-vm.sh - the project's VM harness: boot Debian's linux-image-6.1 (IPVS/dummy/flowtables/9p as modules) under QEMU and run a
# command in it. Guest root = this host's / over 9p (read-only) + tmpfs overlay, so host binaries
# (ipvsadm, ipset, iptables, ip, curl, `cargo build` output) run unchanged; guest writes stay in RAM.
# Guest output -> our stdout (serial console); guest command's exit status -> our exit status.
#   run-in-vm.sh CMD ARGS...  run CMD in the current directory inside the guest
#   env: VM_ACCEL=tcg|kvm (default tcg, see below) VM_MEM=1024 VM_SMP=1 VM_TIMEOUT=300
#        VM_PRELOAD="ip_vs ..." modules to load at boot (others auto-load on first use)
set -euo pipefail
W=${KPRS_VM_DIR:-/tmp/kprs-vm}; K=$W/kernel

setup() {  # one-time: Debian packages + kernel package extracted under $K (never installed to /boot)
  local p; set +o pipefail; for p in qemu-system-x86_64 ipvsadm ipset iptables depmod ip curl xz; do
    command -v $p >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends qemu-system-x86 busybox-static ipvsadm ipset iptables kmod iproute2 curl xz-utils >/dev/null; break; }
  done; [ -x /bin/busybox ] || apt-get install -y -qq busybox-static >/dev/null
  if [ ! -d $K/lib/modules ]; then
    p=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-6\.1\.[0-9.-]*-amd64\)$/\1/p' | head -1)
    mkdir -p $W/debs $K; (cd $W/debs && apt-get download -qq "$p"); dpkg -x $W/debs/${p}_*.deb $K
  fi
  KVER=$(ls $K/lib/modules | head -1); MODS=$K/lib/modules/$KVER
  [ -f $MODS/modules.dep ] || depmod -b $K $KVER
  if [ ! -f $K/vmlinux ]; then  # uncompressed ELF: QEMU boots it via PVH, skipping the slow xz stub
    local off; off=$(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' $K/boot/vmlinuz-$KVER | cut -d: -f1 | sed -n 1p)
    tail -c +$((off + 1)) $K/boot/vmlinuz-$KVER | xz -dcq --single-stream > $K/vmlinux.tmp || true
    [ -s $K/vmlinux.tmp ] && mv $K/vmlinux.tmp $K/vmlinux || { echo "cannot extract vmlinux" >&2; exit 1; }
  fi
  set -o pipefail
}

build_initramfs() {  # busybox + modules (+ deps from modules.dep); rebuilt when this script changes
  INITRD=$W/initramfs-$KVER.cpio.gz; local st=$W/initramfs.d m f
  [ -f $INITRD ] && [ $INITRD -nt "${BASH_SOURCE[0]}" ] && return
  rm -rf $st; mkdir -p $st/{bin,sbin,proc,sys,dev,lower,rw,newroot,lib/modules/$KVER}
  cp /bin/busybox $st/bin/busybox
  for m in $(/bin/busybox --list); do [ $m = busybox ] || ln -s busybox $st/bin/$m; done
  ln -s ../bin/busybox $st/sbin/modprobe   # kernel request_module() runs /sbin/modprobe from here
  for m in crc32c_generic 9p 9pnet_virtio virtio_mmio overlay dummy veth br_netfilter \
      ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh ip_vs_lc ip_vs_wlc ip_vs_sed ip_vs_nq ip_vs_mh \
      nf_conntrack nf_conntrack_netlink nf_nat ip_set ip_set_hash_ip ip_set_hash_ipport \
      ip_set_hash_ipportip ip_set_hash_ipportnet ip_set_hash_net ip_set_hash_netport \
      ip_set_bitmap_port xt_set xt_ipvs xt_comment xt_mark xt_conntrack xt_MASQUERADE xt_nat \
      xt_addrtype xt_multiport xt_statistic xt_physdev xt_recent xt_tcpudp ipt_REJECT ip6t_REJECT \
      iptable_nat iptable_filter iptable_mangle \
      iptable_raw ip6table_nat ip6table_filter ip6table_mangle nf_tables nft_compat nlmon \
      nft_chain_nat nft_ct nft_nat nft_masq nft_fib_ipv4 nft_fib_ipv6 nft_reject_ipv4 nft_reject_ipv6 \
      nft_numgen nft_objref nft_hash nf_flow_table nf_flow_table_inet nft_flow_offload; do
    f=$(grep -E "/$m\.ko:" $MODS/modules.dep) || { echo "module $m not in $KVER" >&2; exit 1; }
    for f in ${f/:/}; do mkdir -p $st/lib/modules/$KVER/${f%/*}; cp -n $MODS/$f $st/lib/modules/$KVER/$f; done
  done
  cp $MODS/modules.{builtin,builtin.modinfo,order} $st/lib/modules/$KVER/; depmod -b $st $KVER
  cat > $st/init <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
arg() { sed -n "s/.*ipvsvm\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
run=$(arg run); modprobe -a crc32c_generic virtio_mmio 9pnet_virtio 9p overlay $(arg preload | tr , ' ')
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower
mount -t tmpfs -o size=80% tmpfs /rw; mkdir -p /rw/u /rw/w /dev/pts /dev/shm
mount -t overlay -o lowerdir=/lower,upperdir=/rw/u,workdir=/rw/w overlay /newroot
mount -t proc proc /newroot/proc; mount -t sysfs sysfs /newroot/sys; mount -o bind /dev /newroot/dev
mount -t devpts devpts /newroot/dev/pts; mount -t tmpfs tmpfs /newroot/dev/shm; mount -t tmpfs tmpfs /newroot/run
mkdir -p /newroot/lib/modules && mount -o bind /lib/modules /newroot/lib/modules   # for userspace modprobe
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rundir /newroot$run
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
echo "ipvsvm: ready at uptime $(cut -d' ' -f1 /proc/uptime)s"
chroot /newroot /bin/bash $run/cmd </dev/console >/dev/console 2>&1; rc=$?
echo $rc > /newroot$run/rc; echo "ipvsvm: guest exit status $rc at uptime $(cut -d' ' -f1 /proc/uptime)s"
umount /newroot$run; reboot -f
EOF
  chmod +x $st/init
  (cd $st && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > $INITRD.tmp && mv $INITRD.tmp $INITRD
}

# Tests may start several VMs at once: one of them prepares the kernel and initramfs, the rest wait.
mkdir -p $W; exec 9>$W/.setup.lock; flock 9; setup; build_initramfs; flock -u 9
run=$(mktemp -d $W/run.XXXXXX); trap 'rm -rf "$run"' EXIT
[ $# -gt 0 ] || { echo "usage: run-in-vm.sh CMD ARGS..." >&2; exit 64; }
# Forward exported env (minus a few), cwd and argv.
{ declare -px | grep -vE '^declare -[a-zA-Z]*r|^declare -x (PATH|HOME|TERM|SHELL|PWD|OLDPWD|SHLVL|_)='
  printf 'cd %q || exit 1\n' "$PWD"; printf '%q ' "$@"; echo; } > $run/cmd
# /dev/kvm here is nested PVM (kvm_pvm): a stock kernel dies with "KVM internal error. Suberror: 1
# (emulation failure)" at SLUB's lock cmpxchg16b, and even with -cx16 runs >100x slower than TCG.
# So TCG is the default; VM_ACCEL=kvm is for hosts with real (VMX/SVM) KVM.
case ${VM_ACCEL:-tcg} in kvm) acc="-accel kvm -cpu host,-arch-capabilities";; *) acc="-accel tcg,thread=multi -cpu max";; esac
preload=${VM_PRELOAD-ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack}
# microvm has no HPET/PM timer, and under TCG the PIT-based TSC calibration randomly fails (then the
# guest hangs in early boot), so pass the TSC rate: the TCG guest TSC ticks at the host's TSC rate.
tsc=$(awk '/^cpu MHz/ {printf "%d", $4 * 1000; exit}' /proc/cpuinfo)
set +e
timeout ${VM_TIMEOUT:-300} qemu-system-x86_64 $acc -M microvm -m ${VM_MEM:-1024} -smp ${VM_SMP:-1} \
  -nodefaults -no-user-config -nographic -serial stdio -no-reboot -kernel $K/vmlinux -initrd $INITRD \
  -append "console=ttyS0 quiet loglevel=1 panic=-1 mitigations=off cryptomgr.notests tsc_early_khz=$tsc tsc=reliable ipvsvm.run=$run ipvsvm.preload=${preload// /,}" \
  -fsdev local,id=hr,path=/,security_model=none,readonly=on,multidevs=remap -device virtio-9p-device,fsdev=hr,mount_tag=hostroot \
  -fsdev local,id=rd,path=$run,security_model=none -device virtio-9p-device,fsdev=rd,mount_tag=rundir \
  </dev/null | sed -u -e 's/\r$//' -e '/\] reboot: Restarting system$/d'
qrc=${PIPESTATUS[0]}
[ -f $run/rc ] && exit "$(cat $run/rc)"
echo "run-in-vm: no exit status from guest (qemu/timeout rc=$qrc)" >&2; exit 125
