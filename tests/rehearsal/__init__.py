"""A rehearsal of the rendered training job as a cluster runs it, on one machine (issue 9).

Every other test shares the code's assumptions: an editable install, local model folders, fakes that fail
the way we expect. This one takes the PyTorchJob (and TrainJob) that the train step renders and runs it the
way the cluster would, so a defect of the kind "green tests, broken at first contact with a cluster" fails a
test. tests/test_rehearsal.py drives it; each scenario is one process started as

    unshare --mount --propagation private python -m tests.rehearsal.scenario SCENARIO.json

Pieces (each module's docstring has the details):

- image.py: the "trainer image", a virtualenv with the package installed from a wheel built from the same
  files the Dockerfile copies (non-editable); heavy dependencies are borrowed from the development
  environment through one ``.pth`` path line, which leaves the dev install's editable finder inactive.
- cluster.py: the Training Operator (PyTorchJob v1, release-1.9 env injection and status rules), the Trainer
  v2 controller (TrainJob on the torch-distributed runtime) and a kubelet, behind tests/fakes/k8s_api.py.
- container.py: the kubelet's container runtime: PID/mount/UTS namespaces per pod, volumes at their mount
  paths, the launcher's install hidden, ``execve`` of the container's command and args with its env.
- scenario.py: the machine as the cluster has it (claims at /mnt/data and /mnt/models, service names in
  /etc/hosts, a kubeconfig for the fake API server) and the KFP train step's own function run against it.

Choices, and where the rehearsal deliberately differs from a cluster:

- 2 pods x 1 process, gloo on CPU, DeepSpeed ZeRO-3 (the pipeline default); the trainer config is built by
  the train step itself except ``use_cpu=True`` (no GPUs here), the one change to what the pods get.
- The launcher polls every second instead of ten (scenario.POLL_SECONDS); everything else it does as the
  train step calls it, including finding the API server through its kubeconfig.
- Rendezvous: every service and pod name resolves to 127.0.0.1 through a hosts file bind-mounted over
  /etc/hosts; the master port is a free port chosen per job, not the operator's 23456 or the Trainer's
  29500, so rehearsals running side by side on one machine cannot collide.
- The base model is named by Hub id (``rehearsal-org/tiny-qwen3``) and filed in a pre-populated Hugging Face
  cache in the real hub layout under HF_HOME on the data claim (tests/hf_cache.py); the pods run with
  ``HF_HUB_OFFLINE=1`` because there is no network (a cluster would download into that same cache).
- Pods get an empty per-pod HOME and working directory (a container's /root and /workspace), no Service
  env variables, and the torch extension folder of the development environment (the image's pre-built
  DeepSpeed ops; DeepSpeed's CPU shared-memory op is otherwise compiled in every pod).
- Eviction is modelled as the kubelet's hard eviction (SIGKILL, phase Failed, reason Evicted,
  DisruptionTarget TerminationByKubelet); TrainJob pods are not retried in place (the Job's backoffLimit).
"""
