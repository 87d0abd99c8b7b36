# Sourced by tools/setup/setup_env.sh: the definition of stack $STACK.
#
# Each supported stack sets
#   STACK_VENV     its venv folder (the default stack keeps .venv)
#   MMCV_DIST      the PyPI name of its mmcv (mmcv or onedl-mmcv)
#   MMCV_VERSION   the mmcv version, compiled from the sdist once and cached
#   MMCV_CXX       the C++ standard the sdist's -std=c++14/17 flags are
#                  raised to ('': left as they are): torch >= 2.1 headers
#                  need C++17 (mmcv 2.0.1 passes C++14; fixed upstream in
#                  2.1.0), torch 2.14 headers need C++20
#   TORCH_VERSION  the torch it is built against (2.13.0: the CPU build on
#                  this project's machines' disk)
#   TORCHVISION_VERSION  the torchvision, where the stack imports it ('':
#                  none; torch 2.13.0 has no matching CPU torchvision)
#   PRESENT        import names that must import
#   ABSENT         import names that must not be installed
#   EDITABLE       1: mmnanguard is installed editable (the development
#                  stack); 0: the venv holds the stack only, and
#                  tools/setup/check_wheel.sh installs the built wheel
# and the pinned packages are tools/setup/stacks/$STACK.txt; where
# tools/setup/stacks/$STACK-nodeps.txt exists, its packages are installed
# after them with --no-deps (toolboxes whose declared requirements cannot
# be met on these machines; their real needs are listed in $STACK.txt).
# shellcheck shell=bash
SUPPORTED_STACKS="rotate mmdet onedl core toolboxes"
TORCH_VERSION="" TORCHVISION_VERSION=""
case "$STACK" in
    rotate)
        STACK_VENV=.venv MMCV_DIST=mmcv MMCV_VERSION=2.0.1 MMCV_CXX=17
        PRESENT="mmdet mmrotate mmseg" ABSENT="" EDITABLE=1 ;;
    mmdet)
        STACK_VENV=.venv-mmdet MMCV_DIST=mmcv MMCV_VERSION=2.1.0 MMCV_CXX=
        PRESENT="mmdet mmseg" ABSENT="mmrotate" EDITABLE=0 ;;
    onedl)
        # onedl-mmrotate's models import torchvision (h2rbox_v2)
        STACK_VENV=.venv-onedl MMCV_DIST=onedl-mmcv MMCV_VERSION=2.3.6
        MMCV_CXX=20 PRESENT="mmdet mmrotate mmseg" ABSENT="" EDITABLE=0
        TORCH_VERSION=2.14.1 TORCHVISION_VERSION=0.29.1 ;;
    toolboxes)
        # mmyolo, mmpretrain, mmpose, mmocr, mmaction2 beside mmdet 3.1.0:
        # they need mmcv < 2.1.0 and import torchvision, which has no CPU
        # build for torch 2.13.0, so this stack takes the onedl stack's torch
        # 2.14.1 / torchvision 0.29.1 and compiles mmcv 2.0.1 against it.
        STACK_VENV=.venv-toolboxes MMCV_DIST=mmcv MMCV_VERSION=2.0.1
        MMCV_CXX=20 PRESENT="mmdet mmyolo mmpretrain mmpose mmocr mmaction"
        ABSENT="mmrotate"
        EDITABLE=0 TORCH_VERSION=2.14.1 TORCHVISION_VERSION=0.29.1 ;;
    core)
        STACK_VENV=.venv-core MMCV_DIST=mmcv MMCV_VERSION=2.0.1 MMCV_CXX=17
        PRESENT="mmdet" ABSENT="mmrotate mmseg" EDITABLE=0 ;;
    *)
        echo "[setup] unknown STACK='$STACK': expected one of" \
             "$SUPPORTED_STACKS (see docs/stacks.md)" >&2
        exit 2 ;;
esac
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCHVISION_VERSION="${TORCHVISION_VERSION:-}"
STACK_REQS="tools/setup/stacks/$STACK.txt"
# The file name of the mmcv wheel and sdist (PEP 427: '-' becomes '_').
MMCV_FILE="${MMCV_DIST//-/_}-$MMCV_VERSION"
