"""llama.cpp's /infill (fill-in-the-middle for code models), served through the completions' machinery."""
