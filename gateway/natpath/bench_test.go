package natpath

import (
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkPacket: the program's cost per packet, as the kernel measures it (BPF_PROG_TEST_RUN:
// the program alone, no driver, no stack), for a known flow's packets each way, TCP and UDP,
// direct and masqueraded. ns/packet is the figure; the system call around each run is not in it.
func BenchmarkPacket(b *testing.B) {
	r := newRunner(b)
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		name                 string
		client, vip, backend netip.AddrPort
		proto                uint8
	}{
		{"udp-direct", ap("198.51.100.90:50000"), ap("203.0.113.50:80"), ap("10.244.1.11:8080"), 17},
		{"udp-masq", ap("198.51.100.90:50001"), ap("203.0.113.50:81"), ap("192.0.2.11:30080"), 17},
		{"tcp-direct", ap("198.51.100.90:50002"), ap("203.0.113.50:80"), ap("10.244.1.11:8080"), 6},
	} {
		// The flow: its first packet (a SYN for TCP), the answer, and the client's ACK (for TCP
		// a real handshake: the ACK acknowledges the SYN-ACK, so the flow is established).
		_, out := r.run(b, frame(pktSpec{src: c.client, dst: c.vip, proto: c.proto, tcpFlags: 0x02}))
		seen := readTuple(out).src
		reply := frame(pktSpec{src: c.backend, dst: seen, proto: c.proto, tcpFlags: 0x12, ack: 1, payload: make([]byte, 64)})
		r.run(b, reply)
		fwd := frame(pktSpec{src: c.client, dst: c.vip, proto: c.proto, tcpFlags: 0x10, seq: 1, ack: 1, payload: make([]byte, 64)})
		r.run(b, fwd)
		if c.proto == 6 {
			reply = frame(pktSpec{src: c.backend, dst: seen, proto: c.proto, tcpFlags: 0x10, seq: 1, ack: 1, payload: make([]byte, 64)})
		}
		for _, d := range []struct {
			dir string
			pkt []byte
		}{{"forward", fwd}, {"reply", reply}} {
			b.Run(c.name+"-"+d.dir, func(b *testing.B) {
				// One run per call: the program rewrites the packet in place, so the kernel's
				// repeat would run it on its own output. The kernel times the run itself.
				var total time.Duration
				var runs int64
				var bad uint32
				for b.Loop() {
					if err := in(r.ns, func() error {
						for range 1000 {
							ret, dur, err := timedRun(r.path.prog.FD(), d.pkt)
							if err != nil {
								return err
							}
							if ret != actRedirect {
								bad = ret
							}
							total += dur
							runs++
						}
						return nil
					}); err != nil {
						b.Fatal(err)
					}
				}
				if bad != 0 {
					b.Fatalf("verdict %d, want taken", bad)
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(runs), "ns/packet")
			})
		}
	}
}

// timedRun runs program fd once on pkt arriving on lo (as tryRun) and returns the verdict and the
// run's duration as the kernel measured it (BPF_PROG_TEST_RUN's attr.duration, which the library
// gives only for runs without a context).
func timedRun(fd int, pkt []byte) (uint32, time.Duration, error) {
	ctx := make([]byte, 40)
	binary.LittleEndian.PutUint32(ctx[36:], 1)
	out := make([]byte, len(pkt)+256)
	// union bpf_attr, test: prog_fd, retval, data_size_in, data_size_out, data_in, data_out,
	// repeat, duration, ctx_size_in, ctx_size_out, ctx_in, ctx_out, flags, cpu, batch_size.
	var attr [80]byte
	le := binary.LittleEndian
	le.PutUint32(attr[0:], uint32(fd))
	le.PutUint32(attr[8:], uint32(len(pkt)))
	le.PutUint32(attr[12:], uint32(len(out)))
	le.PutUint64(attr[16:], uint64(uintptr(unsafe.Pointer(&pkt[0]))))
	le.PutUint64(attr[24:], uint64(uintptr(unsafe.Pointer(&out[0]))))
	le.PutUint32(attr[32:], 1)
	le.PutUint32(attr[40:], uint32(len(ctx)))
	le.PutUint64(attr[48:], uint64(uintptr(unsafe.Pointer(&ctx[0]))))
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr[0])), unsafe.Sizeof(attr))
	if errno != 0 {
		return 0, 0, errno
	}
	return le.Uint32(attr[4:]), time.Duration(le.Uint32(attr[36:])), nil
}

// BenchmarkSweep: one sweep of an established table of 100,000 live flows (200,000 entries): a
// batched walk, nothing to delete (the common case, every sweepInterval).
func BenchmarkSweep(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (BPF maps)")
	}
	p, err := Load(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	fillFlows(b, p, 100_000, 10)
	for b.Loop() {
		if n, err := p.Sweep(); err != nil || n != 0 {
			b.Fatalf("swept %d, %v", n, err)
		}
	}
}
