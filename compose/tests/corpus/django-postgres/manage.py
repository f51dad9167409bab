print("manage")
