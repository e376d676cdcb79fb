# SPDX-License-Identifier: GPL-2.0-or-later
"""Stand-ins for the Kubernetes API server and the kubelet's PodResources service, for the
tidal tests (never shipped)."""
