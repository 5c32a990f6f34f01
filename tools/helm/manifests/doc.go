// Package manifests renders planex's Kubernetes manifests (the kustomize
// tree deploy/k8s and the Helm chart deploy/helm/planex) in process and
// checks the rendered objects: strict decoding into the k8s.io/api types,
// Pod Security "restricted", selectors and ports that resolve, pinned
// images, no inline secrets, and NetworkPolicies that allow exactly the
// flows planex needs.
package manifests
