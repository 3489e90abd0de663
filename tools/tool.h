/* tools/tool.h - the commands of the mpq tool, one function each
   (argv[0] is the command's name); the table of them is in mpq_tool.c. */
#ifndef MPQ_TOOL_H
#define MPQ_TOOL_H

int cmd_quantize(int argc, char **argv);   /* quantize.c */
int cmd_measure(int argc, char **argv);    /* quantize.c */
int cmd_inspect(int argc, char **argv);    /* mpq_tool.c */
int cmd_dequantize(int argc, char **argv); /* mpq_tool.c */
int cmd_bench(int argc, char **argv);      /* mpq_tool.c */
int cmd_eval(int argc, char **argv);       /* mpq_llm.c */
int cmd_run(int argc, char **argv);        /* mpq_llm.c */
int cmd_speed(int argc, char **argv);      /* mpq_llm.c */
int cmd_calibrate(int argc, char **argv);  /* mpq_llm.c */
int cmd_gen_eval(int argc, char **argv);   /* mpq_llm.c */
int cmd_schedule(int argc, char **argv);   /* schedule.c */

#endif
