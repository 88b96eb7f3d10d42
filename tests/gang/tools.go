//go:build tools

// The programs and API packages tests/gang/crds.sh builds its CustomResourceDefinitions from:
// controller-gen (sigs.k8s.io/controller-tools) over Volcano's published scheduling API.
package tools

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
	_ "volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)
