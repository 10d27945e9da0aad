# vipgate's image for Docker and Buildah users: the same file layout as `make image`, which builds the
# image without Docker (deploy/image) and reproducibly. Build and tag it with the version:
#
#   docker build --build-arg VERSION=$(cat VERSION) -t ghcr.io/vipgate/vipgate:$(cat VERSION) .
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=$(cat VERSION) ...
#   buildah build --build-arg VERSION=$(cat VERSION) -t ghcr.io/vipgate/vipgate:$(cat VERSION) .
#
# Layout: /usr/local/bin/vipgate (static), /etc/passwd and /etc/group with root and nonroot (65532),
# /tmp (1777). The default user is 65532; the node DaemonSet runs it as root with NET_ADMIN,
# NET_RAW and NET_BIND_SERVICE (see deploy/README.md, "The image").

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION
WORKDIR /src
COPY go.mod go.sum ./
COPY third_party/ third_party/
RUN go mod download
COPY . .
# The version defaults to the VERSION file when --build-arg VERSION is not given.
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION:-$(cat VERSION)}" \
      -o /out/usr/local/bin/vipgate ./cmd/vipgate \
 && mkdir -p /out/etc /out/tmp \
 && chmod 1777 /out/tmp \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' > /out/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > /out/etc/group \
 && chmod 0644 /out/etc/passwd /out/etc/group \
 && chmod 0755 /out/usr/local/bin/vipgate

FROM scratch
ARG VERSION
COPY --from=build /out/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.opencontainers.image.title="vipgate" \
      org.opencontainers.image.description="Kubernetes kube-proxy replacement and LoadBalancer speaker" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/vipgate/vipgate" \
      org.opencontainers.image.licenses="NOASSERTION"
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/vipgate"]
