package dataplane

import "github.com/vipgate/vipgate/cluster"

// The balancing algorithms' action kinds (kinds.go; their code is lbalgo.go's). The gateway's flow
// hash kinds, ActDNATJhashMap and ActDupJhashMap, share the jhash-map code and are
// kinds_gateway.go's.

func init() {
	registerActionKinds(map[ActionKind]*actionKindDesc{
		ActDNATProtoPortJhashMap: {
			encode: encodeJhashMap(hashShape{flow: true}, false), text: jhashMapText(hashShape{flow: true}, false),
			hint: mapModulusHint, trace: traceJhashMapDNAT(KindProtoPortEndpoints), algorithm: cluster.LBMaglev,
			slots: &slotMap{kind: KindProtoPortEndpoints},
		},
		ActDNATSrcHashMap: {
			encode: encodeJhashMap(hashShape{tuple: true}, false), text: jhashMapText(hashShape{tuple: true}, false),
			hint: mapModulusHint, trace: traceSrcHashMap(true, false), algorithm: cluster.LBSourceHash,
		},
		ActDNATProtoPortSrcHashMap: {
			encode: encodeJhashMap(hashShape{}, false), text: jhashMapText(hashShape{}, false),
			hint: mapModulusHint, trace: traceSrcHashMap(false, false), algorithm: cluster.LBSourceHash,
		},
		ActDupSrcHashMap: {
			encode: encodeJhashMap(hashShape{tuple: true}, true), text: jhashMapText(hashShape{tuple: true}, true),
			hint: mapModulusHint, trace: traceSrcHashMap(true, true), algorithm: cluster.LBSourceHash,
		},
		ActDNATRoundRobin: {
			encode: encodeRoundRobin, text: roundRobinText, hint: roundRobinHint, trace: traceRoundRobin,
			algorithm: cluster.LBRoundRobin,
		},
	})
}
