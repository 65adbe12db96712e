#!/usr/bin/env bash
# llm-batch-operator on a local kind cluster, for machines with Docker (docs/install.md, "Try it
# on kind"). Safe to re-run: it rebuilds the images and upgrades the release.
#
#   hack/kind/up.sh
#   LLMBATCH_KIND_ENGINE=simulated hack/kind/up.sh    # skip the ~7 GB CPU vLLM image
#
# 1. creates the kind cluster of hack/kind/kind-config.yaml (a control plane + one worker
#    labelled as the executor node pool),
# 2. builds the images with `make` and loads them into the nodes (`kind load docker-image`),
# 3. runs MinIO in namespace llmbatch-store as the object store (an emptyDir: dev only),
# 4. installs charts/llm-batch-operator with hack/kind/values-kind.yaml: operator, gateway and
#    the CPU pool "smollm2-cpu" (vLLM's CPU build with SmolLM2, or the simulated engine),
# 5. creates the tenant namespace "demo" with an API key and prints how to reach the gateway.
#
# Settings (environment): KIND_CLUSTER_NAME (llmbatch), KIND_NODE_IMAGE (kind's default),
# LLMBATCH_KIND_ENGINE (vllm | simulated), IMAGE_REGISTRY, IMAGE_TAG (as `make images`),
# TENANT (demo). Needs docker, kind, kubectl and helm (also found in .cache/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=${KIND_CLUSTER_NAME:-llmbatch}
ENGINE=${LLMBATCH_KIND_ENGINE:-vllm}
TENANT=${TENANT:-demo}
RELEASE=llm-batch-operator # contains the chart name, so object names are "<release>-<part>"
NAMESPACE=llmbatch-system
WORKERS=llmbatch-workers # values-kind.yaml: the pool's workerNamespace
STORE_NS=llmbatch-store
STORE_SECRET=llmbatch-store # values-kind.yaml: store.secretName and the pool's storeSecretName
BUCKET=llmbatch
MINIO_IMAGE=quay.io/minio/minio:RELEASE.2025-04-22T22-12-26Z
STATE=.cache/kind
export PATH="$PWD/.cache/bin:$PATH"

log() { printf '\n== %s\n' "$*"; }
die() {
  printf 'hack/kind/up.sh: %s\n' "$*" >&2
  exit 1
}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || die "$tool is not installed (kubectl and helm: \`make kubectl helm\` builds them into .cache/bin)"
done
docker info >/dev/null 2>&1 || die "docker cannot reach a Docker engine (is the daemon running?)"
case $ENGINE in
vllm | simulated) ;;
*) die "LLMBATCH_KIND_ENGINE must be vllm or simulated, not '$ENGINE'" ;;
esac

make_vars=()
[[ -n ${IMAGE_REGISTRY:-} ]] && make_vars+=("IMAGE_REGISTRY=$IMAGE_REGISTRY")
[[ -n ${IMAGE_TAG:-} ]] && make_vars+=("IMAGE_TAG=$IMAGE_TAG")
names=$(make -s image-names "${make_vars[@]}")
image_ref() { awk -v name="$1" '$1 == name { print $2 }' <<<"$names"; }
operator_image=$(image_ref operator)
gateway_image=$(image_ref gateway)
cpu_executor_image=$(image_ref executor-cpu)
registry=${operator_image%/*}
tag=${operator_image##*:}
# A `latest` tag makes Kubernetes pull (imagePullPolicy Always): the loaded images would be ignored.
[[ $tag != latest ]] || die "IMAGE_TAG=latest cannot be used with kind-loaded images; pick another tag"

kctl() { kubectl --context "kind-$CLUSTER" "$@"; }

log "kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "exists; reusing it"
else
  kind create cluster --name "$CLUSTER" --config hack/kind/kind-config.yaml \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
mkdir -p "$STATE"
kind get kubeconfig --name "$CLUSTER" >"$STATE/kubeconfig"

log "images (engine: $ENGINE)"
if [[ $ENGINE == vllm ]]; then
  make image-operator image-gateway image-executor-cpu "${make_vars[@]}"
  pool_image=$cpu_executor_image
else
  # The operator image holds the whole package, executor included; the simulated engine needs
  # neither vLLM nor model weights.
  make image-operator image-gateway "${make_vars[@]}"
  pool_image=$operator_image
fi
kind load docker-image --name "$CLUSTER" "$operator_image" "$gateway_image"
if [[ $ENGINE == vllm ]]; then
  # Only the pool's node runs executor pods; the image is large.
  kind load docker-image --name "$CLUSTER" --nodes "$CLUSTER-worker" "$cpu_executor_image"
fi

log "object store: MinIO in namespace $STORE_NS"
kctl create namespace "$STORE_NS" --dry-run=client -o yaml | kctl apply -f -
kctl create namespace "$NAMESPACE" --dry-run=client -o yaml | kctl apply -f -
# One generated key pair, kept across re-runs (MinIO's root user is the store's only user).
if kctl -n "$STORE_NS" get secret "$STORE_SECRET" >/dev/null 2>&1; then
  access=$(kctl -n "$STORE_NS" get secret "$STORE_SECRET" -o jsonpath='{.data.AWS_ACCESS_KEY_ID}' | base64 --decode)
  secret=$(kctl -n "$STORE_NS" get secret "$STORE_SECRET" -o jsonpath='{.data.AWS_SECRET_ACCESS_KEY}' | base64 --decode)
else
  access=llmbatch
  secret=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
fi
store_secret() { # namespace
  kctl -n "$1" create secret generic "$STORE_SECRET" \
    --from-literal=AWS_ACCESS_KEY_ID="$access" --from-literal=AWS_SECRET_ACCESS_KEY="$secret" \
    --dry-run=client -o yaml | kctl apply -f -
}
store_secret "$STORE_NS"
store_secret "$NAMESPACE"
kctl apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: minio, namespace: $STORE_NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: minio}}
  template:
    metadata: {labels: {app: minio}}
    spec:
      containers:
        - name: minio
          image: $MINIO_IMAGE
          args: [server, /data]
          env:
            - name: MINIO_ROOT_USER
              valueFrom: {secretKeyRef: {name: $STORE_SECRET, key: AWS_ACCESS_KEY_ID}}
            - name: MINIO_ROOT_PASSWORD
              valueFrom: {secretKeyRef: {name: $STORE_SECRET, key: AWS_SECRET_ACCESS_KEY}}
          ports: [{name: s3, containerPort: 9000}]
          readinessProbe: {httpGet: {path: /minio/health/ready, port: s3}}
          volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: minio, namespace: $STORE_NS}
spec:
  selector: {app: minio}
  ports: [{name: s3, port: 9000, targetPort: s3}]
EOF
kctl -n "$STORE_NS" rollout status deploy/minio --timeout=300s
# The bucket, made with boto3 from the operator image (already in the nodes).
kctl -n "$STORE_NS" delete job create-bucket --ignore-not-found >/dev/null
kctl apply -f - <<EOF
apiVersion: batch/v1
kind: Job
metadata: {name: create-bucket, namespace: $STORE_NS}
spec:
  backoffLimit: 10
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: create-bucket
          image: $operator_image
          imagePullPolicy: Never
          envFrom: [{secretRef: {name: $STORE_SECRET}}]
          command:
            - python
            - -c
            - |
              import boto3
              s3 = boto3.client("s3", region_name="us-east-1",
                                endpoint_url="http://minio.$STORE_NS.svc.cluster.local:9000")
              try:
                  s3.create_bucket(Bucket="$BUCKET")
              except s3.exceptions.BucketAlreadyOwnedByYou:
                  pass
              print("bucket $BUCKET ready")
EOF
kctl -n "$STORE_NS" wait --for=condition=complete job/create-bucket --timeout=300s

log "helm upgrade --install $RELEASE (namespace $NAMESPACE)"
helm --kube-context "kind-$CLUSTER" upgrade --install "$RELEASE" charts/llm-batch-operator \
  --namespace "$NAMESPACE" -f hack/kind/values-kind.yaml \
  --set image.registry="$registry" --set image.tag="$tag" \
  --set "examplePools.pools[0].spec.executor.image=$pool_image" \
  --set "examplePools.pools[0].spec.executor.engine=$ENGINE" \
  --wait --timeout 10m
# Executor pods read the store keys from the pool's storeSecretName in the worker namespace,
# which the chart has just created.
store_secret "$WORKERS"
kctl -n "$NAMESPACE" rollout status "deploy/$RELEASE-operator" --timeout=300s
kctl get batchpools

log "tenant namespace $TENANT and an API key"
kctl create namespace "$TENANT" --dry-run=client -o yaml | kctl apply -f -
[[ -x .venv/bin/llmbatch ]] || make venv
key=$(.venv/bin/llmbatch keys create --namespace "$TENANT" --gateway-namespace "$NAMESPACE" \
  --kubeconfig "$STATE/kubeconfig")
port=$(kctl -n "$NAMESPACE" get svc "$RELEASE-gateway" -o jsonpath='{.spec.ports[0].port}')
cat >"$STATE/llmbatch.env" <<EOF
export KUBECONFIG=$PWD/$STATE/kubeconfig
export OPENAI_BASE_URL=http://127.0.0.1:8000/v1
export OPENAI_API_KEY=$key
EOF
chmod 600 "$STATE/llmbatch.env"

cat <<EOF

llm-batch-operator runs on kind cluster "$CLUSTER" (pool smollm2-cpu, engine $ENGINE).

Reach the gateway (leave it running in another terminal):
  kubectl --context kind-$CLUSTER -n $NAMESPACE port-forward svc/$RELEASE-gateway 8000:$port

Then, with the OpenAI SDK (tenant "$TENANT"; the key is in $STATE/llmbatch.env):
  source $STATE/llmbatch.env
  mkdir -p .cache/kind/run && cd .cache/kind/run && ../../../.venv/bin/python ../../../examples/seed000_client.py

Or with kubectl:
  kubectl --context kind-$CLUSTER apply -f examples/batch.yaml
  kubectl --context kind-$CLUSTER get batches -n $TENANT -w

Remove everything:  kind delete cluster --name $CLUSTER
EOF
