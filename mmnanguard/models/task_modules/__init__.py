# Copyright (c) mmnanguard contributors. All rights reserved.
from .coders import *  # noqa: F401,F403
