# Copyright (c) mmnanguard contributors. All rights reserved.
