// The flannel CNI plugin (the "flannel" type of kube-flannel's cni-conf.json: it reads flanneld's
// /run/flannel/subnet.env and delegates to the bridge plugin), built from the Go module it lived in
// until containernetworking/plugins v1.0 moved it to github.com/flannel-io/cni-plugin. That
// module has no version on the module proxy this is built from, and Debian's
// containernetworking-plugins ships no flannel plugin, so this is v0.9.1's, the last in
// containernetworking/plugins: CNI spec up to 0.4.0, hence cniVersion 0.3.1 in
// test/cluster/manifests/flannel.yaml. Build with
//
//	cd test/flannel/cni && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' \
//	    -o ../../../bin/flannel-cni github.com/containernetworking/plugins/plugins/meta/flannel
module github.com/vipgate/vipgate/test/flannel/cni

go 1.26.0

tool github.com/containernetworking/plugins/plugins/meta/flannel

require (
	github.com/Microsoft/go-winio v0.4.11 // indirect
	github.com/Microsoft/hcsshim v0.8.6 // indirect
	github.com/buger/jsonparser v0.0.0-20180808090653-f4dd9f5a6b44 // indirect
	github.com/containernetworking/cni v0.8.1 // indirect
	github.com/containernetworking/plugins v0.9.1 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	golang.org/x/crypto v0.0.0-20200622213623-75b288015ac9 // indirect
	golang.org/x/sys v0.0.0-20201117170446-d9b008d0a637 // indirect
)
