package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	metallbv1beta1 "go.universe.tf/metallb/api/v1beta1"
	metallbv1beta2 "go.universe.tf/metallb/api/v1beta2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// DefaultNamespace is the namespace of a file object that names none, as with kubectl.
const DefaultNamespace = metav1.NamespaceDefault

// decoded is one object decoded from a manifest document, or the reason it was refused. It depends
// only on the document's bytes, so it can be cached by content and reused across loads (that is how
// unchanged objects keep their pointers).
type decoded struct {
	// kind and name identify the object for a Rejection ("Service", "demo/web"); best effort when the
	// document is broken.
	kind string
	name string
	// item is the 1-based index inside a v1 List, 0 for a top-level object.
	item int
	// proxied is set for a Service or EndpointSlice whose labels could be read, and proxyLabels
	// holds those of its labels ServiceProxyFilter reads: the file source leaves the objects its
	// filter ignores out, silently (and does not report them even if they are invalid), as the
	// Kubernetes source never even receives them.
	proxied     bool
	proxyLabels map[string]string
	// Exactly one of the following is set.
	service *Service
	slice   *EndpointSlice
	node    *Node
	metallb metav1.Object
	err     error
}

// header is the part of any object used to pick its type and name it in errors.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// listDoc is a v1 List; its items are decoded one by one so that a bad item refuses only itself.
type listDoc struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []json.RawMessage `json:"items"`
}

// maxDocuments bounds the documents (and list items) read from one file, so that a runaway generator
// cannot make a single file hold up the whole load.
const maxDocuments = 10000

// splitDocuments splits a multi-document YAML (or JSON) file. A syntax error in the framing ends the
// split: everything after it is reported as one broken document.
func splitDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("splitting documents: %w", err)
		}
		if len(docs) == maxDocuments {
			return docs, fmt.Errorf("more than %d documents", maxDocuments)
		}
		// The reader reuses nothing, but copy anyway: callers keep documents as cache keys.
		docs = append(docs, bytes.Clone(doc))
	}
}

// decodeDocument decodes one document into zero (empty document), one, or (for a v1 List) several
// objects. It never panics and never returns an error: problems are carried in decoded.err.
func decodeDocument(doc []byte) []decoded {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return []decoded{{kind: "document", err: fmt.Errorf("malformed YAML: %w", err)}}
	}
	js = bytes.TrimSpace(js)
	if bytes.Equal(js, []byte("null")) || len(js) == 0 {
		return nil // only comments or whitespace
	}
	if js[0] != '{' {
		return []decoded{{kind: "document", err: errors.New("not a YAML mapping (an object with apiVersion and kind)")}}
	}
	var h header
	if err := json.Unmarshal(js, &h); err != nil {
		return []decoded{{kind: "document", err: fmt.Errorf("reading apiVersion/kind/metadata: %w", err)}}
	}
	if h.APIVersion == "v1" && h.Kind == "List" {
		var l listDoc
		if err := strictJSON(js, &l); err != nil {
			return []decoded{{kind: "List", err: err}}
		}
		if len(l.Items) > maxDocuments {
			return []decoded{{kind: "List", err: fmt.Errorf("more than %d items", maxDocuments)}}
		}
		out := make([]decoded, 0, len(l.Items))
		for i, item := range l.Items {
			d := decodeObject(item, true)
			d.item = i + 1
			out = append(out, d)
		}
		return out
	}
	return []decoded{decodeObject(js, false)}
}

// decodeObject decodes one JSON object strictly into the type its apiVersion and kind select.
func decodeObject(js []byte, inList bool) decoded {
	var h header
	if err := json.Unmarshal(js, &h); err != nil {
		return decoded{kind: "object", err: fmt.Errorf("reading apiVersion/kind/metadata: %w", err)}
	}
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	d := decoded{kind: h.Kind, name: ns + "/" + h.Metadata.Name}
	if h.Metadata.Name == "" {
		d.name = ""
	}
	gvk := h.APIVersion + ", Kind=" + h.Kind
	switch {
	case h.APIVersion == "" || h.Kind == "":
		d.kind = "object"
		d.err = errors.New("apiVersion and kind are required")
	case h.APIVersion == "v1" && h.Kind == "Service":
		var svc corev1.Service
		if d.err = strictJSON(js, &svc); d.err == nil {
			d.proxied, d.proxyLabels = true, proxyLabels(svc.Labels)
			defaultNamespace(&svc.ObjectMeta)
			d.service, d.err = ServiceFromAPI(&svc)
		}
	case h.APIVersion == discoveryv1.SchemeGroupVersion.String() && h.Kind == "EndpointSlice":
		var es discoveryv1.EndpointSlice
		if d.err = strictJSON(js, &es); d.err == nil {
			d.proxied, d.proxyLabels = true, proxyLabels(es.Labels)
			defaultNamespace(&es.ObjectMeta)
			d.slice, d.err = EndpointSliceFromAPI(&es)
		}
	case h.APIVersion == "v1" && h.Kind == "Node":
		d.name = h.Metadata.Name // cluster-scoped
		var n corev1.Node
		if d.err = strictJSON(js, &n); d.err == nil {
			d.node, d.err = NodeFromAPI(&n)
		}
	case h.APIVersion == "v1" && h.Kind == "List":
		d.err = errors.New("a List inside a List is not supported")
	case h.APIVersion == "v1" && h.Kind == "Secret":
		d.metallb, d.err = decodeBGPSecret(js)
	case h.APIVersion == metallbv1beta1.GroupVersion.String():
		d.metallb, d.err = decodeMetalLB(js, h.Kind, metallbV1beta1Kinds)
	case h.APIVersion == metallbv1beta2.GroupVersion.String():
		d.metallb, d.err = decodeMetalLB(js, h.Kind, metallbV1beta2Kinds)
	default:
		d.err = fmt.Errorf("unsupported kind (apiVersion=%s): vipgate reads v1 Service, Node, Secret (BGP passwords) and List, "+
			"discovery.k8s.io/v1 EndpointSlice, metallb.io/v1beta1 IPAddressPool, L2Advertisement, "+
			"BGPAdvertisement, Community, BFDProfile and metallb.io/v1beta2 BGPPeer", gvk)
	}
	return d
}

// The MetalLB kinds vipgate reads, by API version, with a constructor for each.
var (
	metallbV1beta1Kinds = map[string]func() metav1.Object{
		"IPAddressPool":    func() metav1.Object { return &metallbv1beta1.IPAddressPool{} },
		"L2Advertisement":  func() metav1.Object { return &metallbv1beta1.L2Advertisement{} },
		"BGPAdvertisement": func() metav1.Object { return &metallbv1beta1.BGPAdvertisement{} },
		"Community":        func() metav1.Object { return &metallbv1beta1.Community{} },
		"BFDProfile":       func() metav1.Object { return &metallbv1beta1.BFDProfile{} },
	}
	metallbV1beta2Kinds = map[string]func() metav1.Object{
		"BGPPeer": func() metav1.Object { return &metallbv1beta2.BGPPeer{} },
	}
)

// decodeBGPSecret decodes a v1 Secret that holds a BGP session password (a MetalLB BGPPeer's
// passwordSecret): type kubernetes.io/basic-auth with a "password" key, as MetalLB requires.
// stringData is folded into data, as the API server does.
func decodeBGPSecret(js []byte) (metav1.Object, error) {
	var s corev1.Secret
	if err := strictJSON(js, &s); err != nil {
		return nil, err
	}
	defaultNamespace(&s.ObjectMeta)
	if err := checkMeta(s.Namespace, s.Name, dns1123Subdomain); err != nil {
		return nil, err
	}
	if s.Type != corev1.SecretTypeBasicAuth {
		return nil, fmt.Errorf("type: %q: vipgate reads Secrets only as BGP passwords, which are of type %s", s.Type, corev1.SecretTypeBasicAuth)
	}
	for k, v := range s.StringData {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
	if len(s.Data[corev1.BasicAuthPasswordKey]) == 0 {
		return nil, fmt.Errorf("data.%s: required (the BGP session password)", corev1.BasicAuthPasswordKey)
	}
	return &s, nil
}

// decodeMetalLB decodes a MetalLB object strictly. Validation of its content comes later, with the
// allocator and the speaker that use it; here only the shape, the name and the v0.16.2 fields whose
// bounds a CRD would enforce (validateMetalLB) are checked.
func decodeMetalLB(js []byte, kind string, kinds map[string]func() metav1.Object) (metav1.Object, error) {
	newObj, ok := kinds[kind]
	if !ok {
		return nil, fmt.Errorf("unsupported MetalLB kind %q in this apiVersion", kind)
	}
	obj := newObj()
	if err := strictJSON(js, obj); err != nil {
		return nil, err
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(DefaultNamespace)
	}
	if err := checkMeta(obj.GetNamespace(), obj.GetName(), dns1123Subdomain); err != nil {
		return nil, err
	}
	if err := validateMetalLB(obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// strict decodes a YAML or JSON document into obj, refusing unknown and duplicate fields. It does what
// sigs.k8s.io/yaml.UnmarshalStrict does, but matches field names case-sensitively as the API server
// does (sigs.k8s.io/json): encoding/json would take "clusterIp" for "clusterIP", and a typo that happens
// to differ only in case would be silently accepted.
func strict(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	return strictJSON(js, obj)
}

// strictJSON is strict for a document already converted to JSON (decodeDocument converts each document
// once; parsing it as YAML again would double the cost of a load).
func strictJSON(js []byte, obj any) error {
	strictErrs, err := sigsjson.UnmarshalStrict(js, obj)
	if err != nil {
		return fmt.Errorf("decoding: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("decoding: %w", errors.Join(strictErrs...))
	}
	return nil
}

func defaultNamespace(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = DefaultNamespace
	}
}
