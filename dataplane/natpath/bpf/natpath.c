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
// Built by `make bpf` (clang -target bpf) into natpath_bpfel.o, which natpath.go embeds; the Go
// side (natpath.go) owns every map but the flow table's entries, which only this program writes
// (and the Go side deletes, for stale flows).
//
// The hash that picks a new flow's Maglev slot is the nftables rule's (dataplane/gateway_ir.go,
// GatewaySlot): jhash over saddr . sport . daddr . dport (IPv6: saddr . sport) as they sit in nft
// registers (ports padded to 4 bytes), seed 0x76697067, scaled like nft_jhash. So the program, the
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
static __u64 (*bpf_ktime_get_coarse_ns)(void) = (void *)BPF_FUNC_ktime_get_coarse_ns;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 flags) = (void *)BPF_FUNC_l4_csum_replace;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)BPF_FUNC_redirect;
static long (*bpf_redirect_neigh)(__u32 ifindex, struct bpf_redir_neigh *params, int plen, __u64 flags) = (void *)BPF_FUNC_redirect_neigh;
static long (*bpf_fib_lookup)(void *ctx, struct bpf_fib_lookup *params, int plen, __u32 flags) = (void *)BPF_FUNC_fib_lookup;
static long (*bpf_skb_pull_data)(struct __sk_buff *skb, __u32 len) = (void *)BPF_FUNC_skb_pull_data;
static __s64 (*bpf_csum_update)(struct __sk_buff *skb, __u32 csum) = (void *)BPF_FUNC_csum_update;

#define AF_INET 2
#define AF_INET6 10
// The verdict for what the program leaves: the next tcx program, then the stack (TC_ACT_OK would
// end the tcx chain and skip the clsact filters of a CNI attached after it).
#define PASS TC_ACT_UNSPEC

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

// flow_val is what a flow's packets become: the new source and destination, and when the entry
// was last used (coarse ns; refreshed at most once a second).
struct flow_val {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 flags;
	__u64 seen;
};

// config is the program's settings (one element, written by natpath.go).
struct config {
	__u64 tcp_timeout_ns;
	__u64 udp_timeout_ns;
	__u64 closing_timeout_ns; // a closing TCP flow (FLOW_CLOSING)
	__u32 snat_port_min; // the masquerade ports, host order
	__u32 snat_ports;    // how many
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
	CNT_CLASH,       // a new flow whose reply tuple a live flow holds: left to the stack
	CNT_ICMP,        // ICMP errors about the program's flows, translated and forwarded
	CNT_FRAG,        // later fragments of a datagram whose first fragment a flow took
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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
} vg_flows SEC(".maps");

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

#define SEED 0x76697067
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
// read in the CPU's byte order as the kernel does (little-endian).
static always_inline __u32 flow_hash(const __u32 *w, __u32 n)
{
	__u32 a, b, c;
	a = b = c = 0xdeadbeef + n * 4 + SEED;
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
};

#define TH_FIN 0x01
#define TH_SYN 0x02
#define TH_RST 0x04
#define TH_ACK 0x10

// pull_l4 makes the headers up to a transport header at l4off readable in place (a TCP header's
// worth if the packet has it, else a UDP header's): the stack may hold a packet's headers in
// fragments of its buffer.
static always_inline int pull_l4(struct __sk_buff *skb, __u32 l4off)
{
	if ((long)skb->data + l4off + TCP_HLEN <= (long)skb->data_end)
		return 0;
	if (bpf_skb_pull_data(skb, l4off + TCP_HLEN) < 0 && bpf_skb_pull_data(skb, l4off + UDP_HLEN) < 0)
		return -1;
	return 0;
}

// parse reads skb's tuple into p; 0 when the program may take the packet.
static always_inline int parse(struct __sk_buff *skb, struct parsed *p)
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
		if (ip->version != 4 || ip->ihl != 5 || tot > skb->len - ETH_HLEN || ip->ttl <= 1)
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
		if (ip6->version != 6 || plen > skb->len - ETH_HLEN - 40 || ip6->hop_limit <= 1)
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
		if ((void *)(th + 14) > end)
			return -1;
		p->tcp_flags = th[13];
	}
	p->csum_off = p->l4off + (p->k.proto == IPPROTO_TCP_ ? TCP_CSUM_OFF : UDP_CSUM_OFF);
	p->mangled0 = p->k.proto == IPPROTO_UDP_ ? BPF_F_MARK_MANGLED_0 : 0;
	return 0;
}

// route finds the next hop of a packet from src to dst (the packet's family) arriving on the
// skb's device. With want_src it also asks for the source address the kernel would use from the
// egress device (masquerade's), into src.
static always_inline long route(struct __sk_buff *skb, struct bpf_fib_lookup *fib, struct parsed *p, __u8 *src, __u8 *dst, __be16 sport, __be16 dport, int want_src)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->ifindex = skb->ingress_ifindex;
	// The packet's length, so that the lookup checks it against the route's MTU (a learned path
	// MTU included) whatever its result; a GSO packet's is the device's check (tot_len 0).
	if (skb->gso_segs <= 1)
		fib->tot_len = skb->len - ETH_HLEN;
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
static always_inline int send_to(struct __sk_buff *skb, struct bpf_fib_lookup *fib, long rc)
{
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
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return TC_ACT_SHOT;
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	return bpf_redirect(fib->ifindex, 0);
}

// transmit rewrites skb to v (its addresses and ports, from the tuple in p), lowers the TTL, and
// sends it to the next hop fib found (rc: its result). The transport checksum is updated by the
// kernel's helper (it knows whether the checksum is still to be computed, CHECKSUM_PARTIAL, and
// keeps a CHECKSUM_COMPLETE sum right); everything else is written directly.
static always_inline int transmit(struct __sk_buff *skb, struct parsed *p, struct flow_val *v, struct bpf_fib_lookup *fib, long rc)
{
	int v4 = p->k.family == 4;
	__u64 addrs = addr_diff(addr_diff(0, p->k.saddr, v->saddr, v4), p->k.daddr, v->daddr, v4);
	__u64 ports = csum_replace32(0, (__u32)p->k.sport | ((__u32)p->k.dport << 16), (__u32)v->sport | ((__u32)v->dport << 16));
	if (bpf_l4_csum_replace(skb, p->csum_off, 0, fold32(addrs), BPF_F_PSEUDO_HDR | p->mangled0) < 0 ||
	    bpf_l4_csum_replace(skb, p->csum_off, 0, fold32(ports), p->mangled0) < 0)
		return TC_ACT_SHOT;
	// The helpers may have moved the packet: look again.
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__be16 *pp;
	if (v4) {
		if (data + L4_OFF4 + 4 > end)
			return TC_ACT_SHOT;
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
			return TC_ACT_SHOT;
		pp = data + L4_OFF6;
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		// A CHECKSUM_COMPLETE sum covers the IPv6 header: the addresses changed by what the
		// transport checksum took back, which the helper above also took from skb->csum (right
		// for IPv4, whose header checksum absorbs its addresses; BPF_F_IPV6 of Linux 6.16 skips
		// that), so it goes back in, with the hop limit's change. Ignored unless COMPLETE.
		__u16 *hopw = (__u16 *)&ip6->payload_len + 1; // next header and hop limit: one word
		__u16 oldw = *hopw;
		ip6->hop_limit--;
		bpf_csum_update(skb, fold32(addrs + (__u16)~oldw + *hopw));
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		if (data + L4_OFF6 + 4 > end)
			return TC_ACT_SHOT;
		pp = data + L4_OFF6;
		ip6 = data + ETH_HLEN;
		__builtin_memcpy(&ip6->saddr, v->saddr, 16);
		__builtin_memcpy(&ip6->daddr, v->daddr, 16);
	}
	pp[0] = v->sport;
	pp[1] = v->dport;
	return send_to(skb, fib, rc);
}

static always_inline int usable(long rc)
{
	return rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH;
}

// mark_forward sets flag on the forward entry of the flow whose reply entry is r (a reply p).
static always_inline void mark_forward(struct parsed *p, struct flow_val *r, __u32 flag)
{
	struct flow_key fk = {};
	__builtin_memcpy(fk.saddr, r->daddr, 16);
	__builtin_memcpy(fk.daddr, r->saddr, 16);
	fk.sport = r->dport;
	fk.dport = r->sport;
	fk.proto = p->k.proto;
	fk.family = p->k.family;
	struct flow_val *f = bpf_map_lookup_elem(&vg_flows, &fk);
	if (f && !(f->flags & FLOW_REPLY))
		f->flags |= flag;
}

// forget_reply deletes the reply entry of the flow whose forward entry is f (a packet p), before
// the flow is dealt again.
static always_inline void forget_reply(struct parsed *p, struct flow_val *f)
{
	struct flow_key rk = {};
	__builtin_memcpy(rk.saddr, f->daddr, 16);
	__builtin_memcpy(rk.daddr, f->saddr, 16);
	rk.sport = f->dport;
	rk.dport = f->sport;
	rk.proto = p->k.proto;
	rk.family = p->k.family;
	bpf_map_delete_elem(&vg_flows, &rk);
}

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

// idle_timeout is how long entry v of a flow of protocol proto may stay unused: TCP as conntrack
// times out its states (a flow not answered yet or closing: 2 min, as SYN_SENT and TIME_WAIT;
// established: flowTimeout), UDP 2 min.
static always_inline __u64 idle_timeout(struct config *cfg, struct flow_val *v, __u8 proto)
{
	if (proto != IPPROTO_TCP_)
		return cfg->udp_timeout_ns;
	if ((v->flags & FLOW_CLOSING) || !(v->flags & (FLOW_REPLY | FLOW_REPLIED)))
		return cfg->closing_timeout_ns;
	return cfg->tcp_timeout_ns;
}

// forward_key is the key of the forward entry of the flow whose reply entry is r.
static always_inline void forward_key(struct flow_key *fk, struct flow_val *r, struct parsed *p)
{
	__builtin_memset(fk, 0, sizeof(*fk));
	__builtin_memcpy(fk->saddr, r->daddr, 16);
	__builtin_memcpy(fk->daddr, r->saddr, 16);
	fk->sport = r->dport;
	fk->dport = r->sport;
	fk->proto = p->k.proto;
	fk->family = p->k.family;
}

// reply_live says whether the reply entry r at rk still belongs to a live flow: its forward entry
// exists, still sends to rk's tuple, and is within its idle timeout. A reply entry's own use says
// nothing of a flow whose traffic goes one way (a client's UDP stream).
static always_inline int reply_live(struct flow_key *rk, struct flow_val *r, struct parsed *p, struct config *cfg, __u64 now)
{
	struct flow_key fk;
	forward_key(&fk, r, p);
	struct flow_val *f = bpf_map_lookup_elem(&vg_flows, &fk);
	if (!f || (f->flags & FLOW_REPLY))
		return 0;
	const __u32 *fs = (const __u32 *)f->saddr, *fd = (const __u32 *)f->daddr;
	const __u32 *rs = (const __u32 *)rk->saddr, *rd = (const __u32 *)rk->daddr;
	if (fd[0] != rs[0] || fd[1] != rs[1] || fd[2] != rs[2] || fd[3] != rs[3] || f->dport != rk->sport ||
	    fs[0] != rd[0] || fs[1] != rd[1] || fs[2] != rd[2] || fs[3] != rd[3] || f->sport != rk->dport)
		return 0;
	return now - f->seen < idle_timeout(cfg, f, p->k.proto);
}

// claim_reply writes the reply entry rv at rk unless a live flow holds that tuple (0: written).
// A stale entry there is replaced; two CPUs claiming one tuple: one wins (BPF_NOEXIST).
static always_inline int claim_reply(struct flow_key *rk, struct flow_val *rv, struct parsed *p, struct config *cfg, __u64 now)
{
	struct flow_val *old = bpf_map_lookup_elem(&vg_flows, rk);
	if (old) {
		if ((old->flags & FLOW_REPLY) && reply_live(rk, old, p, cfg, now))
			return -1;
		bpf_map_delete_elem(&vg_flows, rk);
	}
	return bpf_map_update_elem(&vg_flows, rk, rv, BPF_NOEXIST);
}

// new_flow deals a flow to its Maglev slot's backend and writes its two entries (the client's
// packets, the replies), masquerading when the VIP port says so.
static subprogram int new_flow(struct __sk_buff *skb, struct parsed *p, struct vip_val *vip, struct config *cfg, __u64 now)
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
	__u32 h = flow_hash(w, n);
	__u32 slot = (__u32)(((__u64)h * vip->slots) >> 32);
	void *table = bpf_map_lookup_elem(&vg_maglev, &vip->id);
	if (!table)
		goto none;
	struct backend *b = bpf_map_lookup_elem(table, &slot);
	if (!b || b->port == 0)
		goto none;

	struct flow_val fwd = {};
	__builtin_memcpy(fwd.saddr, p->k.saddr, 16);
	__builtin_memcpy(fwd.daddr, b->addr, 16);
	fwd.sport = p->k.sport;
	fwd.dport = b->port;
	fwd.seen = now;
	int snat = vip->flags & VIP_SNAT;
	struct bpf_fib_lookup fib;
	long rc = route(skb, &fib, p, fwd.saddr, fwd.daddr, fwd.sport, fwd.dport, snat);
	if (!usable(rc)) {
		count(CNT_FIB);
		return PASS;
	}

	struct flow_key rk = {};
	__builtin_memcpy(rk.saddr, b->addr, 16);
	__builtin_memcpy(rk.daddr, fwd.saddr, 16);
	rk.sport = b->port;
	rk.proto = p->k.proto;
	rk.family = p->k.family;
	struct flow_val rv = {};
	__builtin_memcpy(rv.saddr, p->k.daddr, 16);
	__builtin_memcpy(rv.daddr, p->k.saddr, 16);
	rv.sport = p->k.dport;
	rv.dport = p->k.sport;
	rv.flags = FLOW_REPLY;
	rv.seen = now;
	if (snat) {
		// A masquerade port whose reply tuple no live flow holds, tried at SNAT_TRIES places
		// from one the flow's hash chooses.
		rv.flags |= FLOW_SNAT;
		fwd.flags |= FLOW_SNAT;
		if (cfg->snat_ports == 0)
			goto full;
		__u32 start = h % cfg->snat_ports;
		int i;
		for (i = 0; i < SNAT_TRIES; i++) {
			__u32 port = cfg->snat_port_min + (start + i * 7919) % cfg->snat_ports;
			rk.dport = __builtin_bswap16((__u16)port);
			if (claim_reply(&rk, &rv, p, cfg, now) == 0)
				break;
		}
		if (i == SNAT_TRIES)
			goto full;
		fwd.sport = rk.dport;
	} else {
		// The client's own tuple: held by a live flow of the same client port through another
		// VIP port to the same backend, it is left to conntrack, which remaps the port.
		rk.dport = p->k.sport;
		if (claim_reply(&rk, &rv, p, cfg, now) < 0) {
			count(CNT_CLASH);
			return PASS;
		}
	}
	if (bpf_map_update_elem(&vg_flows, &p->k, &fwd, BPF_ANY) < 0)
		return PASS;
	count(CNT_NEW);
	remember_frag(p, &fwd, now);
	return transmit(skb, p, &fwd, &fib, rc);
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
static subprogram int icmp_error(struct __sk_buff *skb, int v4)
{
	__u32 need = v4 ? ICMP4_NEED : ICMP6_NEED;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + need > end) {
		if (bpf_skb_pull_data(skb, need) < 0)
			return PASS;
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
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
		    tot < ICMP4_NEED - ETH_HLEN || tot > skb->len - ETH_HLEN)
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
		if (ip6->version != 6 || ip6->hop_limit <= 1 || plen < ICMP6_NEED - ETH_HLEN - 40 || plen > skb->len - ETH_HLEN - 40)
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
	struct flow_val *e = bpf_map_lookup_elem(&vg_flows, &k);
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
	if (!usable(rc)) {
		count(CNT_FIB);
		return PASS;
	}
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (v4) {
		if (data + ICMP4_NEED > end)
			return TC_ACT_SHOT;
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
			return TC_ACT_SHOT;
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
		bpf_csum_update(skb, fold32((__u16)~oldw + *hopw));
	}
	count(CNT_ICMP);
	return send_to(skb, &fib, rc);
}

// frag_follow forwards a later fragment of an IPv4 datagram whose first fragment a flow took,
// with the addresses the first got (it has no ports; the transport checksum is in the first).
static subprogram int frag_follow(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + 20 > end)
		return PASS;
	struct iphdr *ip = data + ETH_HLEN;
	__u32 tot = __builtin_bswap16(ip->tot_len);
	if (ip->version != 4 || ip->ihl != 5 || ip->ttl <= 1 || tot < 20 + 8 || tot > skb->len - ETH_HLEN)
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
	if (!usable(rc)) {
		count(CNT_FIB);
		return PASS;
	}
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + 20 > end)
		return TC_ACT_SHOT;
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

// REDEAL is known_flow's answer for a flow to be dealt again as a new one.
#define REDEAL 0x7fff

// known_flow forwards a packet of a flow the table holds (its entry v), or says it must be
// dealt again (REDEAL).
static subprogram int known_flow(struct __sk_buff *skb, struct parsed *p, struct flow_val *v, struct config *cfg, __u64 now)
{
	int reply = v->flags & FLOW_REPLY;
	if (now - v->seen >= idle_timeout(cfg, v, p->k.proto)) {
		// A reply entry is as live as its flow's forward entry (the server of a client
		// that talks and seldom hears); a forward entry that idled out is dealt again.
		if (!reply)
			return REDEAL;
		if (!reply_live(&p->k, v, p, cfg, now))
			return PASS; // a flow that ended: not this program's any more
	}
	if (p->tcp_flags & (TH_FIN | TH_RST | TH_SYN)) {
		// TCP's ends, as conntrack follows them: a FIN or RST either way marks the flow
		// closing; a connection's first SYN on a closing flow (the client reusing the
		// tuple) is a new connection, dealt again (its old reply entry goes).
		if (reply) {
			if (p->tcp_flags & (TH_FIN | TH_RST)) {
				v->flags |= FLOW_CLOSING;
				mark_forward(p, v, FLOW_CLOSING);
			}
		} else if ((p->tcp_flags & (TH_SYN | TH_ACK)) == TH_SYN && (v->flags & FLOW_CLOSING)) {
			forget_reply(p, v);
			return REDEAL;
		} else if (p->tcp_flags & (TH_FIN | TH_RST)) {
			v->flags |= FLOW_CLOSING;
		}
	}
	if (reply && !(v->flags & FLOW_REPLIED)) {
		// The flow's first reply: its forward entry learns it is answered (once).
		mark_forward(p, v, FLOW_REPLIED);
		v->flags |= FLOW_REPLIED;
	}
	if (now - v->seen > 1000000000ULL)
		v->seen = now;
	struct flow_val out = *v;
	struct bpf_fib_lookup fib;
	long rc = route(skb, &fib, p, out.saddr, out.daddr, out.sport, out.dport, 0);
	if (!usable(rc)) {
		count(CNT_FIB);
		return PASS;
	}
	count(reply ? CNT_REPLY : CNT_FORWARD);
	remember_frag(p, &out, now);
	return transmit(skb, p, &out, &fib, rc);
}

SEC("tc")
int vipgate_natpath(struct __sk_buff *skb)
{
	// Frames to another host, and VLAN-tagged ones (the tag is out of band here: routing them
	// as if untagged would pick the wrong table): the stack's.
	if (skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return PASS;
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
	__u64 now = bpf_ktime_get_coarse_ns();

	struct flow_val *v = bpf_map_lookup_elem(&vg_flows, &p.k);
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
		// holds (one from before the program, or whose entry was evicted) stays with it.
		count(CNT_NO_SYN);
		return PASS;
	}
	return new_flow(skb, &p, vip, cfg, now);
}

char __license[] SEC("license") = "Dual MIT/GPL";
