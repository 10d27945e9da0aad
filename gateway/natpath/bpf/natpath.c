// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// vipgate's NAT fast path: the gateway's forwarding direct and nodePort, as a tc (tcx) ingress
// program. It does what the family's nftables table does with conntrack for a packet to a VIP port
// — Maglev picks the backend, the destination becomes the backend, masquerade where the table
// would — and hands the packet to the egress device itself (bpf_fib_lookup + bpf_redirect), so the
// IP stack, netfilter and conntrack never see it. Replies are rewritten back on their way in the
// same way. Whatever it does not take goes on unchanged (PASS: to the next tc program, then the
// stack), and the family's table forwards it as before, so the table stays complete on its own.
//
// The same source is also built with -DNATPATH_XDP into natpath_xdp_bpfel.o: the program as an XDP
// program, run before the kernel allocates an skb, on devices with native XDP (natpath.go's
// attach modes). The context macros below are the difference: direct packet access for the skb
// helpers' loads, checksums by hand, a redirect with the MAC addresses bpf_fib_lookup gave. What
// the XDP program cannot finish itself — a next hop whose neighbour is not resolved, an egress
// device that takes no XDP frames, a frame not to the device's MAC, a route that is not usable
// (MTU, unreachable: tc counts those) — it hands to the tc program, attached behind it on the same
// device, untouched and before it changed any state (TC_TAKES: XDP_PASS without a mark), so the tc
// program decides it exactly as it would alone. What it leaves to the stack (PASS) it marks in the
// packet's metadata (the random xdp_mark of vg_config), and the tc program passes a marked packet
// on without looking again: nothing is processed twice.
//
// Built by `make bpf` (clang -target bpf) into natpath_bpfel.o, which natpath.go embeds; the Go
// side (natpath.go) owns every map but the flow tables' entries and vg_state, which only this
// program writes (and the Go side deletes: stale flows, and established flows that ended).
//
// The hash that picks a new flow's Maglev slot is the nftables rule's (dataplane/gateway_ir.go,
// GatewaySlot): jhash over saddr . sport . daddr . dport (IPv6: saddr . sport) as they sit in nft
// registers (ports padded to 4 bytes), with the rules' seed (config's hash_seed: derived from a key
// the gateways share, or 0x76697067 without one), scaled like nft_jhash. So the program, the
// family's table and every other gateway pick the same backend for a flow.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name
#define always_inline inline __attribute__((always_inline))
// A subprogram of its own (a BPF-to-BPF call): its own stack frame, so the paths' locals do not
// add up in one 512-byte frame.
#define subprogram __attribute__((noinline))

// Helpers by number (linux/bpf.h's enum): no libbpf headers needed.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)BPF_FUNC_map_update_elem;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)BPF_FUNC_map_delete_elem;
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx, __u64 flags) = (void *)BPF_FUNC_loop;
static __u64 (*bpf_ktime_get_coarse_ns)(void) = (void *)BPF_FUNC_ktime_get_coarse_ns;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) = (void *)BPF_FUNC_fib_lookup;
#ifdef NATPATH_XDP
static long (*bpf_xdp_load_bytes)(struct xdp_md *xdp, __u32 offset, void *buf, __u32 len) = (void *)BPF_FUNC_xdp_load_bytes;
static long (*bpf_xdp_adjust_meta)(struct xdp_md *xdp, int delta) = (void *)BPF_FUNC_xdp_adjust_meta;
#else
static long (*bpf_skb_load_bytes)(const struct __sk_buff *skb, __u32 offset, void *to, __u32 len) = (void *)BPF_FUNC_skb_load_bytes;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;
static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static __s64 (*bpf_csum_update)(struct __sk_buff *skb, __u32 csum) = (void *)BPF_FUNC_csum_update;
#endif

#define AF_INET 2
#define AF_INET6 10

// The attach point. ctx is the program's context; CTX_LEN its frame's length; PASS the verdict
// for what the program leaves to the stack, DROP for what it drops; TC_TAKES (XDP only) hands a
// packet to the tc program behind it, untouched.
#ifdef NATPATH_XDP
#define ctx_t struct xdp_md
#define CTX_LEN(c) ((__u32)((long)(c)->data_end - (long)(c)->data))
// PASS is turned into XDP_PASS with the mark (vipgate_natxdp): the tc program leaves it alone.
#define PASS 0x7ffe
#define TC_TAKES XDP_PASS
#define DROP XDP_DROP
#define load_bytes bpf_xdp_load_bytes
#else
#define ctx_t struct __sk_buff
#define CTX_LEN(c) ((c)->len)
// The next tcx program, then the stack (TC_ACT_OK would end the tcx chain and skip the clsact
// filters of a CNI attached after it).
#define PASS TC_ACT_UNSPEC
#define DROP TC_ACT_SHOT
#define load_bytes bpf_skb_load_bytes
#endif

#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define TCP_CSUM_OFF 16
#define UDP_CSUM_OFF 6
#define L4_OFF4 (ETH_HLEN + 20)
#define TCP_HLEN 20
#define UDP_HLEN 8
#define L4_OFF6 (ETH_HLEN + 40)

// Keep in step with natpath.go (its binary layouts and TestLayouts).

// vip_key is a VIP port: the address (IPv4 in the first 4 bytes, the rest zero), port in network
// order, protocol, family (4 or 6).
struct vip_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 family;
};

#define VIP_SNAT 1 // masquerade this VIP port's flows (the table's gateway-masq-pick)

// vip_val says where a VIP port's Maglev table is: id keys vg_maglev, slots is its size M.
struct vip_val {
	__u32 id;
	__u32 slots;
	__u32 flags;
	__u32 pad;
};

// backend is one Maglev slot: the pod (direct) or the node and its NodePort (nodePort).
struct backend {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
};

// flow_key is a packet's tuple as it arrives: the client's to a VIP port, or a reply's from a
// backend.
struct flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

#define FLOW_REPLY 1   // the entry rewrites a reply (the source back to the VIP port)
#define FLOW_SNAT 2    // the flow is masqueraded: the reply's destination goes back to the client too
#define FLOW_CLOSING 4 // a FIN or RST passed (TCP): a SYN now opens a new connection
#define FLOW_REPLIED 8 // forward entry: a reply passed; reply entry: its forward entry knows it
#define FLOW_REMAP 16  // not masqueraded, but the client's port was taken: another one, as conntrack's NAT does

// WSCALE_UNKNOWN: the sender's SYN has not been seen (a reply entry before the SYN-ACK).
#define WSCALE_UNKNOWN 0xff
// WSCALE_NONE: (a forward entry) the client's SYN offered no window scale, so neither side
// scales (a shift of 0: wscale & 15).
#define WSCALE_NONE 0x10

// flow_val is what a flow's packets become: the new source and destination, and when the entry
// was last used (coarse ns; refreshed at most once a second). For TCP it also follows the
// entry's sender as conntrack's tcp_in_window does, roughly: end is the sequence number after the
// highest segment it sent, win the window it last advertised (scaled by wscale, its SYN's
// option), which is what the other side may send into. A RST or FIN counts only within them.
struct flow_val {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 flags;
	__u64 seen;
	__u32 end; // host order
	__u32 win;
	__u8 wscale;
	__u8 pad[7];
};

// config is the program's settings (one element, written by natpath.go).
struct config {
	__u64 tcp_timeout_ns;
	__u64 udp_timeout_ns;
	__u64 closing_timeout_ns; // a closing TCP flow (FLOW_CLOSING)
	__u32 snat_port_min; // the masquerade ports, host order
	__u32 snat_ports;    // how many
	__u32 hash_seed;     // the flow hash's seed (the nftables rules' jhash seed: the gateways' shared one)
	__u32 xdp_mark;      // the XDP program's mark on what it left to the stack (random, not 0)
};

// state is what the program itself keeps between packets (one element).
struct state {
	// full_until: the established table refused a flow (full) until then: new flows are left to
	// the stack meanwhile rather than taken and left unconfirmed.
	__u64 full_until;
};

// Counters, per CPU (natpath.go sums them).
enum {
	CNT_NEW,         // new flows taken
	CNT_FORWARD,     // a known flow's packets forwarded
	CNT_REPLY,       // replies rewritten and forwarded
	CNT_NO_BACKEND,  // a VIP port whose slot is empty: left to the stack
	CNT_FIB,         // the route lookup did not give a usable next hop (MTU, unreachable...): left
	CNT_SNAT_FULL,   // no free masquerade port after SNAT_TRIES tries: left to the stack
	CNT_NEIGH,       // forwarded through the neighbour layer (next hop not resolved yet)
	CNT_NO_SYN,      // a VIP port's TCP packet of no flow it holds that opens no connection: left
	CNT_CLASH,       // a new flow whose reply tuple a live flow holds: another client port (snat_full if none)
	CNT_ICMP,        // ICMP errors about the program's flows, translated and forwarded
	CNT_FRAG,        // later fragments of a datagram whose first fragment a flow took
	CNT_MARTIAN,     // a new flow from a source no client can have (loopback, multicast, pods...): dropped
	CNT_FULL,        // a new flow while the established table is full: left to the stack
	CNT_WINDOW,      // a TCP RST or FIN outside the window: forwarded, the flow's state unchanged
	CNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct vip_key);
	__type(value, struct vip_val);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} vg_vips SEC(".maps");

// vg_maglev: table id -> the table, an array of struct backend of M slots (BPF_F_INNER_MAP: the
// tables may differ in size). The inner map's template is natpath.go's (Load).
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__uint(value_size, 4);
} vg_maglev SEC(".maps");

// The flow table in two parts. vg_flows holds confirmed flows (TCP: the handshake completed;
// UDP: answered, then the client's datagram again) and is a plain hash: nothing evicts an
// established flow, entries go when both directions idled out (the program, when it meets one;
// natpath.go's sweep otherwise), and when it is full a new flow is left to the stack (conntrack)
// rather than evicting one. vg_new holds flows not confirmed yet, an LRU of its own: a flood of
// SYNs, of unanswered datagrams or of single exchanges evicts only other unconfirmed flows. A
// flow moves from vg_new to vg_flows when it is confirmed.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} vg_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} vg_new SEC(".maps");

// deny_key is a source prefix no client can have (the cluster's pod networks), an LPM trie key:
// data[0] the family, data[1..17) the address (IPv4 in the first 4); prefixlen counts data's bits.
struct deny_key {
	__u32 prefixlen;
	__u8 data[20];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__type(key, struct deny_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} vg_deny SEC(".maps");

// frag_key is an IPv4 datagram (its addresses as it arrived, id, protocol) whose first fragment
// a flow took; frag_val what its later fragments' addresses become, and when the first was seen.
struct frag_key {
	__u8 saddr[4];
	__u8 daddr[4];
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag_val {
	__u8 saddr[4];
	__u8 daddr[4];
	__u64 seen;
};

// A datagram's fragments arrive within milliseconds of each other: a record older than this is
// not followed (IPv4 ids repeat).
#define FRAG_WINDOW_NS 2000000000ULL

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct frag_key);
	__type(value, struct frag_val);
} vg_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} vg_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct state);
} vg_state SEC(".maps");

#ifdef NATPATH_XDP
// xdp_dev is a device the NAT fast path is attached to (xdp.go writes it; all zero: none): its
// MAC address (a frame to another is not the host's: the tc program decides, as pkt_type tells
// it) and whether it takes redirected XDP frames (NETDEV_XDP_ACT_NDO_XMIT; a veth only while its
// peer has an XDP program or GRO on). A frame whose next hop is a device not here, or not taking
// them, goes to the tc program (an XDP redirect to such a device would drop it).
struct xdp_dev {
	__u8 mac[6];
	__u8 xmit;
	__u8 pad;
};

// By ifindex (an array: looked up twice a packet, inlined); a device of a higher index is not
// here, so the tc program has its packets.
#define XDP_DEVS 65536

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XDP_DEVS);
	__type(key, __u32);
	__type(value, struct xdp_dev);
} vg_xdp_devs SEC(".maps");
#endif

// scratch is new_flow's room for the two entries it writes (per CPU: a program runs on one CPU
// to its end), which its stack frame, under the callers', has not.
struct scratch {
	struct flow_val fwd;
	struct flow_val rv;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} vg_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} vg_counters SEC(".maps");

static always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&vg_counters, &what);
	if (c)
		*c += 1;
}

#define rol32(x, k) (((x) << (k)) | ((x) >> (32 - (k))))
#define jhash_mix(a, b, c)                                                                         \
	{                                                                                          \
		a -= c; a ^= rol32(c, 4); c += b;                                                  \
		b -= a; b ^= rol32(a, 6); a += c;                                                  \
		c -= b; c ^= rol32(b, 8); b += a;                                                  \
		a -= c; a ^= rol32(c, 16); c += b;                                                 \
		b -= a; b ^= rol32(a, 19); a += c;                                                 \
		c -= b; c ^= rol32(b, 4); b += a;                                                  \
	}
#define jhash_final(a, b, c)                                                                       \
	{                                                                                          \
		c ^= b; c -= rol32(b, 14);                                                         \
		a ^= c; a -= rol32(c, 11);                                                         \
		b ^= a; b -= rol32(a, 25);                                                         \
		c ^= b; c -= rol32(b, 16);                                                         \
		a ^= c; a -= rol32(c, 4);                                                          \
		b ^= a; b -= rol32(a, 14);                                                         \
		c ^= b; c -= rol32(b, 24);                                                         \
	}

// flow_hash is the kernel's jhash() of the nft registers of the flow, words w[0..n) (n 4 or 5),
// read in the CPU's byte order as the kernel does (little-endian), with the nftables rules' seed.
static always_inline __u32 flow_hash(const __u32 *w, __u32 n, __u32 seed)
{
	__u32 a, b, c;
	a = b = c = 0xdeadbeef + n * 4 + seed;
	a += w[0];
	b += w[1];
	c += w[2];
	jhash_mix(a, b, c);
	a += w[3];
	if (n == 5)
		b += w[4];
	jhash_final(a, b, c);
	return c;
}


// One's complement arithmetic on raw (memory-order) words: the sum is byte-order independent as
// long as every word is read and written the same way (RFC 1071).

// csum_words adds the 16-bit halves of a 32-bit word to acc.
static always_inline __u64 csum_words(__u64 acc, __u32 w)
{
	return acc + (w & 0xffff) + (w >> 16);
}

// csum_replace32 adds to acc what replacing old with new changes (RFC 1624: ~old + new).
static always_inline __u64 csum_replace32(__u64 acc, __u32 old, __u32 new)
{
	return csum_words(csum_words(acc, ~old), new);
}

// fold32 folds acc into a 32-bit one's complement sum (a __wsum), fold16 into 16 bits.
static always_inline __u32 fold32(__u64 acc)
{
	acc = (acc & 0xffffffff) + (acc >> 32);
	acc = (acc & 0xffffffff) + (acc >> 32);
	return (__u32)acc;
}

static always_inline __u16 fold16(__u64 acc)
{
	__u32 s = fold32(acc);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

// addr_diff adds to acc the change from address old to new (len 4 or 16 bytes).
static always_inline __u64 addr_diff(__u64 acc, const __u8 *old, const __u8 *new, int v4)
{
	const __u32 *o = (const __u32 *)old, *n = (const __u32 *)new;
	acc = csum_replace32(acc, o[0], n[0]);
	if (!v4) {
		acc = csum_replace32(acc, o[1], n[1]);
		acc = csum_replace32(acc, o[2], n[2]);
		acc = csum_replace32(acc, o[3], n[3]);
	}
	return acc;
}

// parsed is what the program reads of a packet.
struct parsed {
	struct flow_key k;
	__u32 l4off;
	__u32 csum_off;
	__u64 mangled0; // BPF_F_MARK_MANGLED_0 for UDP: a zero checksum (IPv4: none) stays zero
	__u8 ttl;
	__u8 tcp_flags; // TCP: the header's flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10)
	__u8 frag;      // IPv4 UDP: the first fragment of a datagram (its id in ipid)
	__be16 ipid;
	__u16 win;   // TCP: the window field
	__u8 doff;   // TCP: the header's length in bytes
	__u32 seq;   // TCP, host order
	__u32 ack;   // TCP, host order
	__u32 l4len; // the transport header and payload's length
	__u8 est;    // its flow's entry is in the established table (vg_flows)
	__s8 wscale; // TCP SYN: its window scale option (tcp_wscale), -1 without one
};

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

// pull_l4 makes the headers up to a transport header at l4off readable in place (a TCP header's
// worth if the packet has it, else a UDP header's): the stack may hold a packet's headers in
// fragments of its buffer.
static always_inline int pull_l4(ctx_t *skb, __u32 l4off)
{
	if ((long)skb->data + l4off + TCP_HLEN <= (long)skb->data_end)
		return 0;
#ifdef NATPATH_XDP
	return 0; // an XDP frame is all in place: what it lacks, it lacks (parse's checks say so)
#else
	if (bpf_skb_pull_data(skb, l4off + TCP_HLEN) < 0 && bpf_skb_pull_data(skb, l4off + UDP_HLEN) < 0)
		return -1;
	return 0;
#endif
}

// parse reads skb's tuple into p; 0 when the program may take the packet.
static always_inline int parse(ctx_t *skb, struct parsed *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto == __constant_htons(ETH_P_IP)) {
		if (pull_l4(skb, L4_OFF4) < 0)
			return -1;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + L4_OFF4 + UDP_HLEN > end)
			return -1;
		struct iphdr *ip = data + ETH_HLEN;
		// What IP input checks before it would forward (version, a length the frame holds), no
		// options, no fragment (MF or an offset), a TTL that survives this hop.
		__u32 tot = __builtin_bswap16(ip->tot_len);
		if (ip->version != 4 || ip->ihl != 5 || tot > CTX_LEN(skb) - ETH_HLEN || ip->ttl <= 1)
			return -1;
		// Fragments: a UDP datagram's first one (MF, offset 0: it has the ports) is the flow's,
		// and says which later ones follow it (frag_follow); anything else fragmented, the
		// stack's.
		if (ip->frag_off & __constant_htons(0x3fff)) {
			if ((ip->frag_off & __constant_htons(0x3fff)) != __constant_htons(0x2000) || ip->protocol != IPPROTO_UDP_)
				return -1;
			p->frag = 1;
			p->ipid = ip->id;
		}
		if (ip->protocol == IPPROTO_TCP_) {
			if (tot < 20 + TCP_HLEN || data + L4_OFF4 + TCP_HLEN > end)
				return -1;
		} else if (ip->protocol != IPPROTO_UDP_ || tot < 20 + UDP_HLEN) {
			return -1;
		}
		__builtin_memcpy(p->k.saddr, &ip->saddr, 4);
		__builtin_memcpy(p->k.daddr, &ip->daddr, 4);
		p->k.proto = ip->protocol;
		p->k.family = 4;
		p->ttl = ip->ttl;
		p->l4off = L4_OFF4;
		p->l4len = tot - 20;
	} else if (eth->h_proto == __constant_htons(ETH_P_IPV6)) {
		if (pull_l4(skb, L4_OFF6) < 0)
			return -1;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + L4_OFF6 + UDP_HLEN > end)
			return -1;
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		// TCP or UDP right after the fixed header: no extension header (fragments among them);
		// a payload length the frame holds (0, a jumbogram's, is left to the stack).
		__u32 plen = __builtin_bswap16(ip6->payload_len);
		if (ip6->version != 6 || plen > CTX_LEN(skb) - ETH_HLEN - 40 || ip6->hop_limit <= 1)
			return -1;
		if (ip6->nexthdr == IPPROTO_TCP_) {
			if (plen < TCP_HLEN || data + L4_OFF6 + TCP_HLEN > end)
				return -1;
		} else if (ip6->nexthdr != IPPROTO_UDP_ || plen < UDP_HLEN) {
			return -1;
		}
		__builtin_memcpy(p->k.saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->k.daddr, &ip6->daddr, 16);
		p->k.proto = ip6->nexthdr;
		p->k.family = 6;
		p->ttl = ip6->hop_limit;
		p->l4off = L4_OFF6;
		p->l4len = plen;
	} else {
		return -1;
	}
	__be16 *ports = data + p->l4off;
	if ((void *)(ports + 2) > end)
		return -1;
	p->k.sport = ports[0];
	p->k.dport = ports[1];
	if (p->k.proto == IPPROTO_TCP_) {
		__u8 *th = data + p->l4off;
		if ((void *)(th + TCP_HLEN) > end)
			return -1;
		p->tcp_flags = th[13];
		p->doff = (th[12] >> 4) * 4;
		// A header length the segment holds (what TCP input checks).
		if (p->doff < TCP_HLEN || p->doff > p->l4len)
			return -1;
		p->seq = __builtin_bswap32(*(__u32 *)(th + 4));
		p->ack = __builtin_bswap32(*(__u32 *)(th + 8));
		p->win = __builtin_bswap16(*(__u16 *)(th + 14));
	}
	p->csum_off = p->l4off + (p->k.proto == IPPROTO_TCP_ ? TCP_CSUM_OFF : UDP_CSUM_OFF);
	p->mangled0 = p->k.proto == IPPROTO_UDP_ ? BPF_F_MARK_MANGLED_0 : 0;
	return 0;
}

// route finds the next hop of a packet from src to dst (the packet's family) arriving on the
// skb's device. With want_src it also asks for the source address the kernel would use from the
// egress device (masquerade's), into src.
static always_inline long route(ctx_t *skb, struct bpf_fib_lookup *fib, struct parsed *p, __u8 *src, __u8 *dst, __be16 sport, __be16 dport, int want_src)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->ifindex = skb->ingress_ifindex;
	// The packet's length, so that the lookup checks it against the route's MTU (a learned path
	// MTU included) whatever its result; a GSO packet's is the device's check (tot_len 0).
#ifdef NATPATH_XDP
	fib->tot_len = CTX_LEN(skb) - ETH_HLEN;
#else
	if (skb->gso_segs <= 1)
		fib->tot_len = skb->len - ETH_HLEN;
#endif
	fib->l4_protocol = p->k.proto;
	fib->sport = sport;
	fib->dport = dport;
	if (p->k.family == 4) {
		fib->family = AF_INET;
		__builtin_memcpy(&fib->ipv4_src, src, 4);
		__builtin_memcpy(&fib->ipv4_dst, dst, 4);
	} else {
		fib->family = AF_INET6;
		__builtin_memcpy(fib->ipv6_src, src, 16);
		__builtin_memcpy(fib->ipv6_dst, dst, 16);
	}
	long rc = bpf_fib_lookup(skb, fib, sizeof(*fib), want_src ? BPF_FIB_LOOKUP_SRC : 0);
	if (want_src && (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH)) {
		if (p->k.family == 4)
			__builtin_memcpy(src, &fib->ipv4_src, 4);
		else
			__builtin_memcpy(src, fib->ipv6_src, 16);
	}
	return rc;
}

// send_to hands skb to the next hop fib found (rc: its result): with the MAC addresses it gave, or
// through the neighbour layer while the next hop is not resolved yet.
static always_inline int send_to(ctx_t *skb, struct bpf_fib_lookup *fib, long rc)
{
#ifndef NATPATH_XDP
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {};
		if (fib->family == AF_INET) {
			nh.nh_family = AF_INET;
			nh.ipv4_nh = fib->ipv4_dst;
		} else {
			nh.nh_family = AF_INET6;
			__builtin_memcpy(nh.ipv6_nh, fib->ipv6_dst, 16);
		}
		count(CNT_NEIGH);
		return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
	}
#endif
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return DROP;
	// XDP: XDP_REDIRECT, to a device of vg_xdp_devs that takes XDP frames (can_send).
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return bpf_redirect(fib->ifindex, 0);
}

// transmit rewrites skb to v (its addresses and ports, from the tuple in p), lowers the TTL, and
// sends it to the next hop fib found (rc: its result). The transport checksum is updated by the
// kernel's helper (it knows whether the checksum is still to be computed, CHECKSUM_PARTIAL, and
// keeps a CHECKSUM_COMPLETE sum right); everything else is written directly.
static always_inline int transmit(ctx_t *skb, struct parsed *p, struct flow_val *v, struct bpf_fib_lookup *fib, long rc)
{
	int v4 = p->k.family == 4;
	__u64 addrs = addr_diff(addr_diff(0, p->k.saddr, v->saddr, v4), p->k.daddr, v->daddr, v4);
	__u64 ports = csum_replace32(0, (__u32)p->k.sport | ((__u32)p->k.dport << 16), (__u32)v->sport | ((__u32)v->dport << 16));
#ifdef NATPATH_XDP
	{
		// By hand, as the helper does it for a complete checksum (an XDP frame's is: no
		// CHECKSUM_PARTIAL here), a zero UDP checksum (none) kept zero.
		void *data = (void *)(long)skb->data;
		void *end = (void *)(long)skb->data_end;
		__u32 off = p->csum_off;
		if (off > L4_OFF6 + TCP_CSUM_OFF)
			return DROP;
		__u16 *cs = data + off;
		if ((void *)(cs + 1) > end)
			return DROP;
		if (!(p->mangled0 && *cs == 0)) {
			__u16 c = ~fold16(csum_words(addrs + ports, (__u16)~*cs));
			*cs = p->mangled0 && c == 0 ? 0xffff : c;
		}
	}
#else
	if (bpf_l4_csum_replace(skb, p->csum_off, 0, fold32(addrs), BPF_F_PSEUDO_HDR | p->mangled0) < 0 ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, fold32(ports), p->mangled0) < 0)
		return DROP;
#endif
	// The helpers may have moved the packet: look again.
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__be16 *pp;
	if (v4) {
		if (data + L4_OFF4 + 4 > end)
			return DROP;
		pp = data + L4_OFF4;
		struct iphdr *ip = data + ETH_HLEN;
		__u16 *ttlw = (__u16 *)&ip->ttl; // TTL and protocol: one checksum word
		__u16 oldw = *ttlw;
		ip->ttl--;
		__u64 acc = csum_words(addrs, (__u16)~ip->check);
		acc = acc + (__u16)~oldw + *ttlw;
		ip->check = ~fold16(acc);
		__builtin_memcpy(&ip->saddr, v->saddr, 4);
		__builtin_memcpy(&ip->daddr, v->daddr, 4);
	} else {
		if (data + L4_OFF6 + 4 > end)
			return DROP;
		pp = data + L4_OFF6;
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		// A CHECKSUM_COMPLETE sum covers the IPv6 header: the addresses changed by what the
		// transport checksum took back, which the helper above also took from skb->csum (right
		// for IPv4, whose header checksum absorbs its addresses; BPF_F_IPV6 of Linux 6.16 skips
		// that), so it goes back in, with the hop limit's change. Ignored unless COMPLETE.
		__u16 *hopw = (__u16 *)&ip6->payload_len + 1; // next header and hop limit: one word
		__u16 oldw = *hopw;
		ip6->hop_limit--;
#ifdef NATPATH_XDP
		(void)oldw; // an XDP frame has no sum to keep
#else
		bpf_csum_update(skb, fold32(addrs + (__u16)~oldw + *hopw));
#endif
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + L4_OFF6 + 4 > end)
			return DROP;
		pp = data + L4_OFF6;
		ip6 = data + ETH_HLEN;
		__builtin_memcpy(&ip6->saddr, v->saddr, 16);
		__builtin_memcpy(&ip6->daddr, v->daddr, 16);
	}
	pp[0] = v->sport;
	pp[1] = v->dport;
	return send_to(skb, fib, rc);
}

// can_send says whether the program can send a packet to the next hop fib found (rc: its
// result): tc with the next hop's MAC address or through the neighbour layer; XDP only with the
// MAC address, to a device that takes XDP frames, the rest being the tc program's (UNSENDABLE),
// which counts what it cannot use either.
static always_inline int can_send(struct bpf_fib_lookup *fib, long rc)
{
#ifdef NATPATH_XDP
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	__u32 i = fib->ifindex;
	struct xdp_dev *d = bpf_map_lookup_elem(&vg_xdp_devs, &i);
	return d && d->xmit;
#else
	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH;
#endif
}

#ifdef NATPATH_XDP
#define UNSENDABLE() return TC_TAKES
#else
#define UNSENDABLE()                                                                               \
	do {                                                                                       \
		count(CNT_FIB);                                                                    \
		return PASS;                                                                       \
	} while (0)
#endif

// remember_frag records, for the first fragment p of a datagram that a flow takes to v, what its
// later fragments' addresses become.
static always_inline void remember_frag(struct parsed *p, struct flow_val *v, __u64 now)
{
	if (!p->frag)
		return;
	struct frag_key fk = {};
	__builtin_memcpy(fk.saddr, p->k.saddr, 4);
	__builtin_memcpy(fk.daddr, p->k.daddr, 4);
	fk.id = p->ipid;
	fk.proto = p->k.proto;
	struct frag_val fv = {};
	__builtin_memcpy(fv.saddr, v->saddr, 4);
	__builtin_memcpy(fv.daddr, v->daddr, 4);
	fv.seen = now;
	bpf_map_update_elem(&vg_frags, &fk, &fv, BPF_ANY);
}

#define SNAT_TRIES 8
// REDEAL is known_flow's answer for a flow to be dealt again as a new one.
#define REDEAL 0x7fff

// idle_timeout is how long entry v of a flow of protocol proto may stay unused: TCP as conntrack
// times out its states (a flow not answered yet or closing: 2 min, as SYN_SENT and TIME_WAIT;
// established: flowTimeout), UDP 2 min. Both entries of a flow carry the flags that decide it.
static always_inline __u64 idle_timeout(struct config *cfg, const struct flow_val *v, __u8 proto)
{
	if (proto != IPPROTO_TCP_)
		return cfg->udp_timeout_ns;
	if ((v->flags & FLOW_CLOSING) || !(v->flags & FLOW_REPLIED))
		return cfg->closing_timeout_ns;
	return cfg->tcp_timeout_ns;
}

static always_inline int fresh(struct config *cfg, const struct flow_val *v, __u8 proto, __u64 now)
{
	return now - v->seen < idle_timeout(cfg, v, proto);
}

// lookup_flow finds the entry at k: in the established table, else among the unconfirmed flows.
static always_inline struct flow_val *lookup_flow(const struct flow_key *k)
{
	struct flow_val *v = bpf_map_lookup_elem(&vg_flows, k);
	if (!v)
		v = bpf_map_lookup_elem(&vg_new, k);
	return v;
}

// partner_key is the key of the other entry of the flow whose entry is v (at k): a forward entry's
// reply entry, a reply entry's forward entry. Either way the tuple v rewrites to, reversed.
static always_inline void partner_key(struct flow_key *pk, const struct flow_val *v, const struct flow_key *k)
{
	__builtin_memset(pk, 0, sizeof(*pk));
	__builtin_memcpy(pk->saddr, v->daddr, 16);
	__builtin_memcpy(pk->daddr, v->saddr, 16);
	pk->sport = v->dport;
	pk->dport = v->sport;
	pk->proto = k->proto;
	pk->family = k->family;
}

// is_partner says whether o (at the partner key of the entry v at k) is that entry's partner: the
// other kind of entry, rewriting to k's tuple reversed. A tuple claimed again by another flow
// since is not.
static always_inline int is_partner(const struct flow_val *o, const struct flow_key *k, const struct flow_val *v)
{
	const __u32 *os = (const __u32 *)o->saddr, *od = (const __u32 *)o->daddr;
	const __u32 *ks = (const __u32 *)k->saddr, *kd = (const __u32 *)k->daddr;
	return ((o->flags ^ v->flags) & FLOW_REPLY) && o->sport == k->dport && o->dport == k->sport &&
	       os[0] == kd[0] && os[1] == kd[1] && os[2] == kd[2] && os[3] == kd[3] &&
	       od[0] == ks[0] && od[1] == ks[1] && od[2] == ks[2] && od[3] == ks[3];
}

// find_partner returns the partner entry of the entry v at k, if it still exists.
static always_inline struct flow_val *find_partner(const struct flow_key *k, const struct flow_val *v)
{
	struct flow_key pk;
	partner_key(&pk, v, k);
	struct flow_val *o = lookup_flow(&pk);
	if (o && !is_partner(o, k, v))
		return 0;
	return o;
}

// flow_live says whether the flow of entry v at k is live: either direction used within its idle
// timeout. A masquerade port (a reply tuple) stays its flow's while either its client or its
// server talks: a client that went quiet while the server sends keeps its port.
static subprogram int flow_live(const struct flow_key *k, const struct flow_val *v, struct config *cfg, __u64 now)
{
	if (fresh(cfg, v, k->proto, now))
		return 1;
	struct flow_val *o = find_partner(k, v);
	return o && fresh(cfg, o, k->proto, now);
}

// forget_flow deletes the entry v at k and its partner, wherever they are.
static subprogram void forget_flow(const struct flow_key *k, const struct flow_val *v)
{
	struct flow_key pk;
	partner_key(&pk, v, k);
	struct flow_val *o = lookup_flow(&pk);
	if (o && is_partner(o, k, v)) {
		bpf_map_delete_elem(&vg_flows, &pk);
		bpf_map_delete_elem(&vg_new, &pk);
	}
	bpf_map_delete_elem(&vg_flows, k);
	bpf_map_delete_elem(&vg_new, k);
}

// claim_reply writes the reply entry rv at rk (among the unconfirmed flows) unless a live flow
// holds that tuple, confirmed or not (0: written). A dead flow's entry there is replaced; two CPUs
// claiming one tuple: one wins (BPF_NOEXIST). The unconfirmed table is looked at first: a flow
// confirmed meanwhile is in the established one before it leaves the other.
static subprogram int claim_reply(struct flow_key *rk, struct flow_val *rv, struct config *cfg, __u64 now)
{
	struct flow_val *old = bpf_map_lookup_elem(&vg_new, rk);
	if (old) {
		if (flow_live(rk, old, cfg, now))
			return -1;
		bpf_map_delete_elem(&vg_new, rk);
	}
	old = bpf_map_lookup_elem(&vg_flows, rk);
	if (old) {
		if (flow_live(rk, old, cfg, now))
			return -1;
		bpf_map_delete_elem(&vg_flows, rk);
	}
	return bpf_map_update_elem(&vg_new, rk, rv, BPF_NOEXIST);
}

// claim_port claims the reply entry rv at rk with one of the masquerade ports as rk's destination
// port, tried at SNAT_TRIES places from a random one (0: claimed, rk.dport the port).
static subprogram int claim_port(struct flow_key *rk, struct flow_val *rv, struct config *cfg, __u64 now)
{
	if (cfg->snat_ports == 0)
		return -1;
	__u32 start = bpf_get_prandom_u32() % cfg->snat_ports;
	// The stride between tries, a prime that does not divide the port count (no count of at
	// most 65,535 is a multiple of both): else every try would be one port.
	__u32 stride = cfg->snat_ports % 7919 ? 7919 : 7907;
	for (int i = 0; i < SNAT_TRIES; i++) {
		__u32 port = cfg->snat_port_min + (start + i * stride) % cfg->snat_ports;
		rk->dport = __builtin_bswap16((__u16)port);
		if (claim_reply(rk, rv, cfg, now) == 0)
			return 0;
	}
	return -1;
}

#define E2BIG_ 7
// FULL_HOLD_NS: after the established table refused a flow, new flows are left to the stack this
// long (the sweep or ended flows make room meanwhile).
#define FULL_HOLD_NS 1000000000ULL

// promote moves the flow of entry v at k (confirmed: its handshake completed, or answered and spoken to again) from
// the unconfirmed flows to the established table. A full table keeps it where it is (it goes on,
// as unconfirmed) and turns new flows away to the stack for a while: established flows are never
// evicted to make room.
static subprogram void promote(const struct flow_key *k, const struct flow_val *v, __u64 now)
{
	struct flow_key pk;
	partner_key(&pk, v, k);
	struct flow_val *o = bpf_map_lookup_elem(&vg_new, &pk);
	struct flow_val *self = bpf_map_lookup_elem(&vg_new, k);
	if (!o || !self || !is_partner(o, k, v))
		return;
	long err = bpf_map_update_elem(&vg_flows, k, self, BPF_NOEXIST);
	if (err == 0) {
		err = bpf_map_update_elem(&vg_flows, &pk, o, BPF_NOEXIST);
		if (err < 0)
			bpf_map_delete_elem(&vg_flows, k);
	}
	if (err < 0) {
		if (err == -E2BIG_) {
			__u32 zero = 0;
			struct state *st = bpf_map_lookup_elem(&vg_state, &zero);
			if (st)
				st->full_until = now + FULL_HOLD_NS;
			count(CNT_FULL);
		}
		return;
	}
	bpf_map_delete_elem(&vg_new, k);
	bpf_map_delete_elem(&vg_new, &pk);
}

#define TCP_OPT_MAX 40

// opt_at is o[i] for a 64-byte buffer, i masked where the verifier sees it (the compiler would
// drop a mask it can prove useless).
static always_inline __u8 opt_at(const __u8 *o, __u32 i)
{
	asm volatile("%0 &= 0x3f" : "+r"(i));
	return o[i];
}

// opt_walk is tcp_wscale's walk over a SYN's options: the options, where it is, what it found.
struct opt_walk {
	__u8 o[64];
	__u32 i;
	__s32 ws;
};

// opt_step is one step of the walk (a bpf_loop callback: verified once, whatever the options).
static subprogram long opt_step(__u32 n, void *ctx)
{
	struct opt_walk *w = ctx;
	__u32 i = w->i;
	if (i >= TCP_OPT_MAX - 1)
		return 1;
	__u8 kind = opt_at(w->o, i);
	if (kind == 0) // end of options
		return 1;
	if (kind == 1) { // no-op
		w->i = i + 1;
		return 0;
	}
	__u8 len = opt_at(w->o, i + 1);
	if (kind == 3 && len == 3) {
		__u8 shift = opt_at(w->o, i + 2);
		w->ws = shift > 14 ? 14 : shift;
		return 1;
	}
	if (len < 2)
		return 1;
	w->i = i + len;
	return 0;
}

// tcp_wscale reads the window scale option of a SYN whose options (optlen bytes) start at off:
// the shift, or -1 without one.
static subprogram int tcp_wscale(ctx_t *skb, __u32 off, __u32 optlen)
{
	struct opt_walk w = {};
	w.ws = -1;
	if (optlen == 0 || optlen > TCP_OPT_MAX)
		return -1;
	// What the verifier can follow: a length of 1 to 64 for a buffer of 64.
	__u32 n1 = optlen - 1;
	asm volatile("%0 &= 0x3f" : "+r"(n1));
	if (load_bytes(skb, off, w.o, n1 + 1) < 0)
		return -1;
	bpf_loop(TCP_OPT_MAX, opt_step, &w, 0);
	return w.ws;
}

// DEFAULT_WIN: the window a RST or FIN is checked against while the receiver's is not known yet.
#define DEFAULT_WIN 65535
// CONFIRM is tcp_track's answer for a flow whose handshake just completed.
#define CONFIRM 1

// tcp_track follows TCP segment p on the entry v of its sender (conntrack's tcp_in_window,
// approximated): a SYN-ACK gives the server's sequence and window scale; a RST or FIN changes the
// flow's state only within the window the receiver would accept (RFC 5961: one a blind attacker
// must guess), else it passes unnoticed; the client's ACK of the server's SYN confirms the flow. A
// client's SYN on a closing flow is a new connection (REDEAL).
static subprogram int tcp_track(ctx_t *skb, struct parsed *p, struct flow_val *v)
{
	__u8 fl = p->tcp_flags;
	int reply = v->flags & FLOW_REPLY;
	// The other entry (the receiver's side) is looked up only where it is needed: an
	// established connection's segments cost no second lookup.
	struct flow_val *o = 0;
	if (fl & TH_SYN) {
		if (!(fl & TH_ACK)) {
			// The client's SYN: retransmitted (the flow goes on), or on a closing flow a new
			// connection reusing the tuple, dealt again (as conntrack does).
			if (!reply && (v->flags & FLOW_CLOSING))
				return REDEAL;
			return 0;
		}
		// The server's SYN-ACK: its side of the connection, if it acknowledges exactly the
		// client's SYN (a spoofed one, from a sender who never saw the SYN, would otherwise
		// reset the server's sequence number so that the real handshake never confirms). Once
		// the flow is established a SYN-ACK (retransmitted, or spoofed to reset what a RST is
		// checked against) changes nothing.
		if (reply && !(fl & TH_RST) && (v->wscale == WSCALE_UNKNOWN || !p->est)) {
			o = find_partner(&p->k, v);
			if (!o || p->ack != o->end)
				return 0;
			int ws = p->wscale;
			v->end = p->seq + 1;
			v->win = p->win;
			// Without both sides' options neither side scales (RFC 7323).
			v->wscale = ws < 0 || (o->wscale & WSCALE_NONE) ? 0 : ws;
			if (ws < 0)
				o->wscale = 0;
		}
		return 0;
	}
	if (fl & (TH_RST | TH_FIN)) {
		o = find_partner(&p->k, v);
		int ok;
		if (v->wscale == WSCALE_UNKNOWN) {
			// The server's answer to the SYN, before any SYN-ACK (a closed port): its RST
			// acknowledges exactly the client's SYN.
			ok = (fl & TH_ACK) && o && p->ack == o->end;
		} else {
			__u32 w = DEFAULT_WIN;
			if (o && o->wscale != WSCALE_UNKNOWN)
				w = o->win + 1;
			__u32 d = p->seq - v->end;
			ok = d <= w || -d <= w;
		}
		if (!ok) {
			count(CNT_WINDOW);
			return 0;
		}
		v->flags |= FLOW_CLOSING;
		if (o)
			o->flags |= FLOW_CLOSING;
	}
	// What the segment tells of its sender's side (its end, its window), believed only from a
	// segment the receiver would take (conntrack's tcp_in_window, approximated): one that
	// acknowledges what the receiver sent, no more, and no less than what the acknowledging
	// side's window lets be in flight; whose sequence number is within the receiver's window of
	// the sender's end; and moving that end by at most the receiver's window. A blind segment
	// must guess both numbers to move anything, and moves the end by one window at most.
	if (v->wscale == WSCALE_UNKNOWN || !(fl & TH_ACK))
		return 0;
	if (!o)
		o = find_partner(&p->k, v);
	if (!o || o->wscale == WSCALE_UNKNOWN)
		return 0;
	__u32 rw = o->win + 1; // a zero window still takes a probe's byte
	__u32 ackwin = v->win > DEFAULT_WIN ? v->win : DEFAULT_WIN;
	if (o->end - p->ack <= ackwin && p->seq - (v->end - rw) <= 2 * rw) {
		__u32 e = p->seq + (p->l4len - p->doff) + ((fl & TH_FIN) ? 1 : 0);
		if (e - v->end - 1 < rw)
			v->end = e;
		__u32 w = (__u32)p->win << (v->wscale & 15);
		if (v->win != w)
			v->win = w;
	}
	// An unconfirmed flow: the handshake's last ACK (or a later one) confirms it if it
	// acknowledges exactly the server's SYN-ACK (nothing else was sent yet): a client that never
	// saw the SYN-ACK (a spoofed source) must guess the server's sequence number, 1 in 2^32. No
	// tolerance taken from this very segment: its own window would let a blind guess in.
	if (!reply && !p->est && (fl & TH_ACK) && !(fl & TH_RST) && (v->flags & FLOW_REPLIED)) {
		if (p->ack == o->end)
			return CONFIRM;
	}
	return 0;
}

// martian says whether p's source is one no client can have: what IP input drops as a martian
// source (0.0.0.0/8, 127.0.0.0/8, multicast, the broadcast address; IPv6 ::, ::1, multicast, and
// IPv4-mapped addresses, which no IPv6 packet carries on the wire), the VIP itself (its packets'
// destination: the address is the gateways'), and the prefixes of vg_deny (the cluster's pod
// networks: a pod's address from outside is spoofed).
static always_inline int martian(struct parsed *p)
{
	const __u8 *s = p->k.saddr;
	const __u32 *w = (const __u32 *)s, *d = (const __u32 *)p->k.daddr;
	if (w[0] == d[0] && w[1] == d[1] && w[2] == d[2] && w[3] == d[3])
		return 1;
	if (p->k.family == 4) {
		if (s[0] == 0 || s[0] == 127 || (s[0] & 0xf0) == 0xe0 || (s[0] == 255 && s[1] == 255 && s[2] == 255 && s[3] == 255))
			return 1;
	} else {
		if (s[0] == 0xff || (w[0] == 0 && w[1] == 0 && w[2] == 0 && (w[3] == 0 || w[3] == __builtin_bswap32(1))) ||
		    (w[0] == 0 && w[1] == 0 && w[2] == __builtin_bswap32(0xffff)))
			return 1;
	}
	struct deny_key dk = {};
	dk.prefixlen = 8 + (p->k.family == 4 ? 32 : 128);
	dk.data[0] = p->k.family;
	__builtin_memcpy(&dk.data[1], s, 16);
	return bpf_map_lookup_elem(&vg_deny, &dk) != 0;
}

// new_flow deals a flow to its Maglev slot's backend and writes its two entries (the client's
// packets, the replies) among the unconfirmed flows, masquerading when the VIP port says so.
static subprogram int new_flow(ctx_t *skb, struct parsed *p, struct vip_val *vip, struct config *cfg, __u64 now)
{
	__u32 w[5];
	__u32 n = 4;
	if (p->k.family == 4) {
		__builtin_memcpy(&w[0], p->k.saddr, 4);
		w[1] = (__u32)p->k.sport;
		__builtin_memcpy(&w[2], p->k.daddr, 4);
		w[3] = (__u32)p->k.dport;
	} else {
		__builtin_memcpy(&w[0], p->k.saddr, 16);
		w[4] = (__u32)p->k.sport;
		n = 5;
	}
	__u32 h = flow_hash(w, n, cfg->hash_seed);
	__u32 slot = (__u32)(((__u64)h * vip->slots) >> 32);
	void *table = bpf_map_lookup_elem(&vg_maglev, &vip->id);
	if (!table)
		goto none;
	struct backend *b = bpf_map_lookup_elem(table, &slot);
	if (!b || b->port == 0)
		goto none;

	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&vg_scratch, &zero);
	if (!sc)
		return PASS;
	__builtin_memset(sc, 0, sizeof(*sc));
	struct flow_val *fwd = &sc->fwd, *rv = &sc->rv;
	__builtin_memcpy(fwd->saddr, p->k.saddr, 16);
	__builtin_memcpy(fwd->daddr, b->addr, 16);
	fwd->sport = p->k.sport;
	fwd->dport = b->port;
	fwd->seen = now;
	if (p->k.proto == IPPROTO_TCP_) {
		// The client's side of the connection from its SYN (whose window is never scaled).
		int ws = p->wscale;
		fwd->end = p->seq + 1;
		fwd->win = p->win;
		fwd->wscale = ws < 0 ? WSCALE_NONE : ws;
	}
	int snat = vip->flags & VIP_SNAT;
	struct bpf_fib_lookup fib;
	long rc = route(skb, &fib, p, fwd->saddr, fwd->daddr, fwd->sport, fwd->dport, snat);
	if (!can_send(&fib, rc))
		UNSENDABLE();

	struct flow_key rk = {};
	__builtin_memcpy(rk.saddr, b->addr, 16);
	__builtin_memcpy(rk.daddr, fwd->saddr, 16);
	rk.sport = b->port;
	rk.proto = p->k.proto;
	rk.family = p->k.family;
	__builtin_memcpy(rv->saddr, p->k.daddr, 16);
	__builtin_memcpy(rv->daddr, p->k.saddr, 16);
	rv->sport = p->k.dport;
	rv->dport = p->k.sport;
	rv->flags = FLOW_REPLY;
	rv->seen = now;
	rv->wscale = WSCALE_UNKNOWN;
	if (snat) {
		// A masquerade port whose reply tuple no live flow holds, tried at SNAT_TRIES places
		// from a random one. Not from the flow's hash: a service that echoes its peer's port
		// would show a client bits of the hash seed with every connection. Only the slot must
		// agree between gateways; a port is this gateway's own (conntrack sync carries it).
		rv->flags |= FLOW_SNAT;
		fwd->flags |= FLOW_SNAT;
		if (claim_port(&rk, rv, cfg, now) < 0)
			goto full;
		fwd->sport = rk.dport;
	} else {
		// The client's own tuple, unless a live flow holds it: the same client port through
		// another VIP port to the same backend (one connection, to the backend). Then, as
		// conntrack's NAT does, the client's address with another port, one of the
		// masquerade ports. Not the stack: conntrack never saw the live flow, would keep the
		// port, and the backend's replies would go to the live flow.
		rk.dport = p->k.sport;
		if (claim_reply(&rk, rv, cfg, now) < 0) {
			count(CNT_CLASH);
			rv->flags |= FLOW_REMAP;
			fwd->flags |= FLOW_REMAP;
			if (claim_port(&rk, rv, cfg, now) < 0)
				goto full;
			fwd->sport = rk.dport;
		}
	}
	if (bpf_map_update_elem(&vg_new, &p->k, fwd, BPF_ANY) < 0) {
		bpf_map_delete_elem(&vg_new, &rk);
		return PASS;
	}
	count(CNT_NEW);
	remember_frag(p, fwd, now);
	return transmit(skb, p, fwd, &fib, rc);
none:
	count(CNT_NO_BACKEND);
	return PASS;
full:
	count(CNT_SNAT_FULL);
	return PASS;
}

#define IPPROTO_ICMP_ 1
#define IPPROTO_ICMPV6_ 58
// An ICMP error's headers, with the inner packet's IP header and first 8 bytes (its ports).
#define ICMP4_NEED (ETH_HLEN + 20 + 8 + 20 + 8)
#define ICMP6_NEED (ETH_HLEN + 40 + 8 + 40 + 8)

// icmp_error forwards an ICMP error about a packet of one of the program's flows, translated as
// conntrack translates a related ICMP error, so that path MTU discovery and unreachables work
// through the program: the inner packet becomes what its sender sent, the outer destination
// that sender, and an outer source that was the inner packet's destination the address the
// sender knows it by. The inner packet's tuple, reversed, is the key of the flow's other entry:
// an error about a reply the program rewrote (sent to the VIP: a router on the client's side,
// fragmentation needed) finds the flow's forward entry; one about a packet to the backend (sent
// to the client or the masquerade address: the node's port unreachable) finds its reply entry.
// Either way the entry's new source and destination, swapped, are the inner packet's original
// addresses and ports. The inner transport checksum is left as it is (no receiver checks it).
static subprogram int icmp_error(ctx_t *skb, int v4)
{
	__u32 need = v4 ? ICMP4_NEED : ICMP6_NEED;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + need > end) {
#ifdef NATPATH_XDP
		return PASS;
#else
		if (bpf_skb_pull_data(skb, need) < 0)
			return PASS;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
#endif
	}
	struct flow_key k = {};
	struct parsed q = {};
	__u8 osrc[16] = {}, odst[16] = {};
	if (v4) {
		if (data + ICMP4_NEED > end)
			return PASS;
		struct iphdr *ip = data + ETH_HLEN;
		__u8 *ic = data + ETH_HLEN + 20;
		struct iphdr *in = data + ETH_HLEN + 28;
		__be16 *inp = data + ETH_HLEN + 48;
		__u32 tot = __builtin_bswap16(ip->tot_len);
		if (ip->version != 4 || ip->ihl != 5 || (ip->frag_off & __constant_htons(0x3fff)) || ip->ttl <= 1 ||
		    tot < ICMP4_NEED - ETH_HLEN || tot > CTX_LEN(skb) - ETH_HLEN)
			return PASS;
		if (ic[0] != 3 && ic[0] != 11) // destination unreachable (fragmentation needed), time exceeded
			return PASS;
		if (in->version != 4 || in->ihl != 5 || (in->protocol != IPPROTO_TCP_ && in->protocol != IPPROTO_UDP_))
			return PASS;
		__builtin_memcpy(k.saddr, &in->daddr, 4);
		__builtin_memcpy(k.daddr, &in->saddr, 4);
		k.sport = inp[1];
		k.dport = inp[0];
		k.proto = in->protocol;
		k.family = 4;
		__builtin_memcpy(osrc, &ip->saddr, 4);
		__builtin_memcpy(odst, &ip->daddr, 4);
		q.k.proto = IPPROTO_ICMP_;
		q.k.family = 4;
	} else {
		if (data + ICMP6_NEED > end)
			return PASS;
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		__u8 *ic = data + ETH_HLEN + 40;
		struct ipv6hdr *in = data + ETH_HLEN + 48;
		__be16 *inp = data + ETH_HLEN + 88;
		__u32 plen = __builtin_bswap16(ip6->payload_len);
		if (ip6->version != 6 || ip6->hop_limit <= 1 || plen < ICMP6_NEED - ETH_HLEN - 40 || plen > CTX_LEN(skb) - ETH_HLEN - 40)
			return PASS;
		if (ic[0] != 1 && ic[0] != 2 && ic[0] != 3) // destination unreachable, packet too big, time exceeded
			return PASS;
		if (in->version != 6 || (in->nexthdr != IPPROTO_TCP_ && in->nexthdr != IPPROTO_UDP_))
			return PASS;
		__builtin_memcpy(k.saddr, &in->daddr, 16);
		__builtin_memcpy(k.daddr, &in->saddr, 16);
		k.sport = inp[1];
		k.dport = inp[0];
		k.proto = in->nexthdr;
		k.family = 6;
		__builtin_memcpy(osrc, &ip6->saddr, 16);
		__builtin_memcpy(odst, &ip6->daddr, 16);
		q.k.proto = IPPROTO_ICMPV6_;
		q.k.family = 6;
	}
	struct flow_val *e = lookup_flow(&k);
	if (!e)
		return PASS;
	struct flow_val v = *e;
	// The outer header: to the inner packet's sender; from the address it knows when the error
	// came from its packet's destination itself.
	__u8 nsrc[16], ndst[16];
	__builtin_memcpy(nsrc, osrc, 16);
	__builtin_memcpy(ndst, v.daddr, 16);
	const __u32 *o = (const __u32 *)osrc, *d = (const __u32 *)k.saddr;
	if (o[0] == d[0] && o[1] == d[1] && o[2] == d[2] && o[3] == d[3])
		__builtin_memcpy(nsrc, v.saddr, 16);
	struct bpf_fib_lookup fib;
	long rc = route(skb, &fib, &q, nsrc, ndst, 0, 0, 0);
	if (!can_send(&fib, rc))
		UNSENDABLE();
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (v4) {
		if (data + ICMP4_NEED > end)
			return DROP;
		struct iphdr *ip = data + ETH_HLEN;
		__u16 *icsum = data + ETH_HLEN + 22;
		struct iphdr *in = data + ETH_HLEN + 28;
		__be16 *inp = data + ETH_HLEN + 48;
		// The inner packet (the ICMP checksum takes every word that changes).
		__u32 os, od, ns, nd;
		__builtin_memcpy(&os, &in->saddr, 4);
		__builtin_memcpy(&od, &in->daddr, 4);
		__builtin_memcpy(&ns, v.daddr, 4);
		__builtin_memcpy(&nd, v.saddr, 4);
		__u64 inaddrs = csum_replace32(csum_replace32(0, os, ns), od, nd);
		__u16 oldc = in->check;
		__u16 newc = ~fold16(csum_words(inaddrs, (__u16)~oldc));
		__u64 ports = csum_replace32(0, (__u32)inp[0] | ((__u32)inp[1] << 16), (__u32)v.dport | ((__u32)v.sport << 16));
		in->saddr = ns;
		in->daddr = nd;
		in->check = newc;
		inp[0] = v.dport;
		inp[1] = v.sport;
		__u64 acc = csum_words(inaddrs + ports + (__u16)~oldc + newc, (__u16)~*icsum);
		*icsum = ~fold16(acc);
		// The outer header, its TTL with it.
		__u32 oos, ood, nos, nod;
		__builtin_memcpy(&oos, osrc, 4);
		__builtin_memcpy(&ood, odst, 4);
		__builtin_memcpy(&nos, nsrc, 4);
		__builtin_memcpy(&nod, ndst, 4);
		__u16 *ttlw = (__u16 *)&ip->ttl;
		__u16 oldw = *ttlw;
		ip->ttl--;
		__u64 oacc = csum_replace32(csum_replace32(0, oos, nos), ood, nod) + (__u16)~oldw + *ttlw;
		ip->check = ~fold16(csum_words(oacc, (__u16)~ip->check));
		ip->saddr = nos;
		ip->daddr = nod;
	} else {
		if (data + ICMP6_NEED > end)
			return DROP;
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		__u16 *icsum = data + ETH_HLEN + 42;
		struct ipv6hdr *in = data + ETH_HLEN + 48;
		__be16 *inp = data + ETH_HLEN + 88;
		// ICMPv6's checksum takes the outer addresses (its pseudo-header) and the inner packet.
		__u64 acc = addr_diff(addr_diff(0, osrc, nsrc, 0), odst, ndst, 0);
		acc = addr_diff(addr_diff(acc, (__u8 *)&in->saddr, v.daddr, 0), (__u8 *)&in->daddr, v.saddr, 0);
		acc = csum_replace32(acc, (__u32)inp[0] | ((__u32)inp[1] << 16), (__u32)v.dport | ((__u32)v.sport << 16));
		*icsum = ~fold16(csum_words(acc, (__u16)~*icsum));
		__builtin_memcpy(&in->saddr, v.daddr, 16);
		__builtin_memcpy(&in->daddr, v.saddr, 16);
		inp[0] = v.dport;
		inp[1] = v.sport;
		__u16 *hopw = (__u16 *)&ip6->payload_len + 1;
		__u16 oldw = *hopw;
		ip6->hop_limit--;
		__builtin_memcpy(&ip6->saddr, nsrc, 16);
		__builtin_memcpy(&ip6->daddr, ndst, 16);
		// A CHECKSUM_COMPLETE sum: every change but the hop limit's is absorbed by the ICMPv6
		// checksum.
#ifdef NATPATH_XDP
		(void)oldw; // an XDP frame has no sum to keep
#else
		bpf_csum_update(skb, fold32((__u16)~oldw + *hopw));
#endif
	}
	count(CNT_ICMP);
	return send_to(skb, &fib, rc);
}

// frag_follow forwards a later fragment of an IPv4 datagram whose first fragment a flow took,
// with the addresses the first got (it has no ports; the transport checksum is in the first).
static subprogram int frag_follow(ctx_t *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + 20 > end)
		return PASS;
	struct iphdr *ip = data + ETH_HLEN;
	__u32 tot = __builtin_bswap16(ip->tot_len);
	if (ip->version != 4 || ip->ihl != 5 || ip->ttl <= 1 || tot < 20 + 8 || tot > CTX_LEN(skb) - ETH_HLEN)
		return PASS;
	struct frag_key fk = {};
	__builtin_memcpy(fk.saddr, &ip->saddr, 4);
	__builtin_memcpy(fk.daddr, &ip->daddr, 4);
	fk.id = ip->id;
	fk.proto = ip->protocol;
	struct frag_val *fv = bpf_map_lookup_elem(&vg_frags, &fk);
	if (!fv || bpf_ktime_get_coarse_ns() - fv->seen > FRAG_WINDOW_NS)
		return PASS;
	__u8 nsrc[16] = {}, ndst[16] = {};
	__builtin_memcpy(nsrc, fv->saddr, 4);
	__builtin_memcpy(ndst, fv->daddr, 4);
	struct parsed q = {};
	q.k.proto = fk.proto;
	q.k.family = 4;
	struct bpf_fib_lookup fib;
	long rc = route(skb, &fib, &q, nsrc, ndst, 0, 0, 0);
	if (!can_send(&fib, rc))
		UNSENDABLE();
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + 20 > end)
		return DROP;
	ip = data + ETH_HLEN;
	__u32 os = ip->saddr, od = ip->daddr, ns, nd;
	__builtin_memcpy(&ns, nsrc, 4);
	__builtin_memcpy(&nd, ndst, 4);
	__u16 *ttlw = (__u16 *)&ip->ttl;
	__u16 oldw = *ttlw;
	ip->ttl--;
	__u64 acc = csum_replace32(csum_replace32(0, os, ns), od, nd) + (__u16)~oldw + *ttlw;
	ip->check = ~fold16(csum_words(acc, (__u16)~ip->check));
	ip->saddr = ns;
	ip->daddr = nd;
	count(CNT_FRAG);
	return send_to(skb, &fib, rc);
}


// known_flow forwards a packet of a flow the tables hold (its entry v; est: in the established
// table: p->est), or says it must be dealt again (REDEAL).
static subprogram int known_flow(ctx_t *skb, struct parsed *p, struct flow_val *v, struct config *cfg, __u64 now)
{
	int reply = v->flags & FLOW_REPLY;
	if (!flow_live(&p->k, v, cfg, now)) {
		// Both ways idle: the flow ended, its entries go. A client's packet is dealt again; a
		// late reply is not this program's any more.
		forget_flow(&p->k, v);
		return reply ? PASS : REDEAL;
	}
	if (!p->est && (v->flags & (FLOW_SNAT | FLOW_REMAP)) && !find_partner(&p->k, v)) {
		// Half a masqueraded (or remapped) flow: the LRU evicted its other entry, so its port
		// is free for another flow to claim. Forwarding on from that port would mix two
		// clients' flows; the half goes, and the packet is a new flow's (or the stack's).
		forget_flow(&p->k, v);
		return reply ? PASS : REDEAL;
	}
	if (reply && (v->flags & FLOW_CLOSING) && p->k.proto == IPPROTO_TCP_ && (p->tcp_flags & (TH_SYN | TH_ACK)) == (TH_SYN | TH_ACK)) {
		// A SYN-ACK to a closed flow's client port: a connection the stack opened (through a
		// VIP port the program does not take, from the same client port, to the same backend)
		// whose replies are the stack's, not the closed flow's, which goes. (A client's SYN
		// through the program's VIP ports would have been dealt again, or given another port.)
		forget_flow(&p->k, v);
		return PASS;
	}
	struct bpf_fib_lookup fib;
	long rc;
#ifdef NATPATH_XDP
	// The next hop before the flow's state changes: what XDP cannot send, the tc program takes
	// as it would alone (and follows the segment then).
	rc = route(skb, &fib, p, v->saddr, v->daddr, v->sport, v->dport, 0);
	if (!can_send(&fib, rc))
		UNSENDABLE();
#endif
	int confirm = 0;
	if (p->k.proto == IPPROTO_TCP_) {
		int r = tcp_track(skb, p, v);
		if (r == REDEAL) {
			forget_flow(&p->k, v);
			return REDEAL;
		}
		confirm = r == CONFIRM;
	} else {
		// UDP: answered, and the client spoke again. A single exchange (a DNS query and its
		// answer) stays with the unconfirmed flows, which the LRU evicts: confirmed on its
		// answer it would hold space in the established table, which nothing evicts, for the
		// 2 min of its timeout, and a modest rate of them would fill it.
		confirm = !reply && (v->flags & FLOW_REPLIED);
	}
	if (reply && !(v->flags & FLOW_REPLIED)) {
		// The flow's first reply: both entries learn it is answered (once).
		struct flow_val *f = find_partner(&p->k, v);
		if (f)
			f->flags |= FLOW_REPLIED;
		v->flags |= FLOW_REPLIED;
	}
	if (now - v->seen > 1000000000ULL)
		v->seen = now;
	struct flow_val out = *v;
	if (confirm && !p->est)
		promote(&p->k, &out, now);
#ifndef NATPATH_XDP
	rc = route(skb, &fib, p, out.saddr, out.daddr, out.sport, out.dport, 0);
	if (!can_send(&fib, rc))
		UNSENDABLE();
#endif
	count(reply ? CNT_REPLY : CNT_FORWARD);
	remember_frag(p, &out, now);
	return transmit(skb, p, &out, &fib, rc);
}

// natpath is the program, either attach point's.
static always_inline int natpath(ctx_t *skb)
{
#ifdef NATPATH_XDP
	{
		// Broadcast and multicast frames: the stack's. A frame to another MAC address than
		// the device's (PACKET_OTHERHOST), or from a device not in vg_xdp_devs: the tc
		// program's, which has pkt_type. VLAN-tagged frames are in band here: not IP.
		void *data = (void *)(long)skb->data;
		void *end = (void *)(long)skb->data_end;
		struct ethhdr *eth = data;
		if ((void *)(eth + 1) > end)
			return PASS;
		if (eth->h_dest[0] & 1)
			return PASS;
		__u32 i = skb->ingress_ifindex;
		struct xdp_dev *d = bpf_map_lookup_elem(&vg_xdp_devs, &i);
		if (!d || d->mac[0] != eth->h_dest[0] || d->mac[1] != eth->h_dest[1] || d->mac[2] != eth->h_dest[2] ||
		    d->mac[3] != eth->h_dest[3] || d->mac[4] != eth->h_dest[4] || d->mac[5] != eth->h_dest[5])
			return TC_TAKES;
	}
#else
	// Frames to another host, and VLAN-tagged ones (the tag is out of band here: routing them
	// as if untagged would pick the wrong table): the stack's.
	if (skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return PASS;
#endif
	{
		void *data = (void *)(long)skb->data;
		void *end = (void *)(long)skb->data_end;
		struct ethhdr *eth = data;
		if ((void *)(eth + 1) + 20 > end)
			return PASS;
		if (eth->h_proto == __constant_htons(ETH_P_IP) && ((struct iphdr *)(eth + 1))->protocol == IPPROTO_ICMP_)
			return icmp_error(skb, 1);
		if (eth->h_proto == __constant_htons(ETH_P_IP) && (((struct iphdr *)(eth + 1))->frag_off & __constant_htons(0x1fff)))
			return frag_follow(skb);
		if (eth->h_proto == __constant_htons(ETH_P_IPV6) && (void *)(eth + 1) + 40 <= end &&
		    ((struct ipv6hdr *)(eth + 1))->nexthdr == IPPROTO_ICMPV6_)
			return icmp_error(skb, 0);
	}
	struct parsed p = {};
	if (parse(skb, &p) < 0)
		return PASS;
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&vg_config, &zero);
	if (!cfg)
		return PASS;
	// A SYN's window scale, read here: a call of its own below the paths' frames would not fit
	// in the stack.
	p.wscale = -1;
	if (p.tcp_flags & TH_SYN)
		p.wscale = tcp_wscale(skb, p.l4off + TCP_HLEN, p.doff - TCP_HLEN);
	__u64 now = bpf_ktime_get_coarse_ns();

	p.est = 1;
	struct flow_val *v = bpf_map_lookup_elem(&vg_flows, &p.k);
	if (!v) {
		v = bpf_map_lookup_elem(&vg_new, &p.k);
		p.est = 0;
	}
	if (v) {
		int ret = known_flow(skb, &p, v, cfg, now);
		if (ret != REDEAL)
			return ret;
	}
	struct vip_key vk = {};
	__builtin_memcpy(vk.addr, p.k.daddr, 16);
	vk.port = p.k.dport;
	vk.proto = p.k.proto;
	vk.family = p.k.family;
	struct vip_val *vip = bpf_map_lookup_elem(&vg_vips, &vk);
	if (!vip)
		return PASS;
	if (p.k.proto == IPPROTO_TCP_ && (p.tcp_flags & (TH_SYN | TH_ACK | TH_FIN | TH_RST)) != TH_SYN) {
		// Only a connection's first SYN opens a flow here: a packet of a connection conntrack
		// holds (one from before the program, or an unconfirmed flow evicted) stays with it.
		count(CNT_NO_SYN);
		return PASS;
	}
	if (martian(&p)) {
		count(CNT_MARTIAN);
		return DROP;
	}
	struct state *st = bpf_map_lookup_elem(&vg_state, &zero);
	if (st && now < st->full_until) {
		count(CNT_FULL);
		return PASS;
	}
	return new_flow(skb, &p, vip, cfg, now);
}

#ifdef NATPATH_XDP
SEC("xdp")
int vipgate_natxdp(struct xdp_md *ctx)
{
	int ret = natpath(ctx);
	int metalen = (int)((long)ctx->data - (long)ctx->data_meta);
	if (ret == TC_TAKES) {
		// The tc program's: without metadata (a frame redirected here by another XDP program
		// may carry some), so that nothing but this program's mark reaches it.
		if (metalen > 0)
			bpf_xdp_adjust_meta(ctx, metalen);
		return XDP_PASS;
	}
	if (ret != PASS)
		return ret;
	// Left to the stack: marked (exactly 4 bytes of metadata, whatever came with the frame),
	// so that the tc program behind passes it on without deciding again. Where the driver
	// keeps no metadata the tc program decides again, the same way.
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&vg_config, &zero);
	if (!cfg)
		return XDP_PASS;
	if (bpf_xdp_adjust_meta(ctx, metalen - 4) < 0)
		return XDP_PASS;
	void *meta = (void *)(long)ctx->data_meta;
	if (meta + 4 > (void *)(long)ctx->data)
		return XDP_PASS;
	*(__u32 *)meta = cfg->xdp_mark;
	return XDP_PASS;
}
#else
SEC("tc")
int vipgate_natpath(struct __sk_buff *skb)
{
	// A packet the XDP program in front of this one left to the stack, marked with this load's
	// random mark (a frame cannot carry metadata in from the wire; another XDP program's would
	// have to guess it): decided already.
	void *meta = (void *)(long)skb->data_meta;
	void *data = (void *)(long)skb->data;
	if (meta + 4 <= data && data - meta == 4) {
		__u32 zero = 0;
		struct config *cfg = bpf_map_lookup_elem(&vg_config, &zero);
		if (cfg && cfg->xdp_mark != 0 && *(__u32 *)meta == cfg->xdp_mark)
			return PASS;
	}
	return natpath(skb);
}
#endif

char __license[] SEC("license") = "Dual MIT/GPL";
