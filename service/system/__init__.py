"""Helpers over the operating system and the interpreter: the CPU budget (`cpus`), returning memory to the OS
(`memory`) and the garbage collector's settings for a serving process (`garbage_collector`)."""
